"""The test runner's scheduler (tests/clusterschedule.py) driven as pytest-xdist drives it, with two
stand-in workers: which tests each worker gets, in what order, and that both stop at the end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.clusterschedule import ALONE, EITHER, PURE, SLOT0, WAITS, ClusterScheduling

COLLECTION = [
    "tests/test_a.py::test_pure_1",
    "tests/test_check.py::test_one",         # slot 0
    "tests/test_check.py::test_two",         # slot 0
    "tests/test_comm.py::test_hooks",        # either, one module unit
    "tests/test_comm.py::test_hier",         # either
    "tests/test_elastic.py::test_a",         # either, split
    "tests/test_elastic.py::test_b",         # either, split
    "tests/test_z.py::test_pure_2",
]
LISTING = "0 tests/test_check.py::test_one\n0 tests/test_check.py::test_two\n* tests/test_comm.py::test_hooks\n" \
          "* tests/test_comm.py::test_hier\n* tests/test_elastic.py::test_a\n* tests/test_elastic.py::test_b\n"


class Worker:
    def __init__(self, name: str, collection: list[str]) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.collection = collection
        self.shutting_down = False
        self.sent: list[list[str]] = []
        self.sched: ClusterScheduling | None = None
        self.beside: list[tuple[str, set[str]]] = []  # (test sent, prefixes of other workers' pending units)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append([self.collection[i] for i in indices])
        if self.sched is not None:
            self.beside += [(t, self.sched._cluster_work(self, elsewhere=True)) for t in self.sent[-1]]

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(tmp_path: Path, workers: int = 2, collection: list[str] = COLLECTION,
              listing: str = LISTING, slots: int = 2) -> tuple[ClusterScheduling, list[Worker]]:
    (tmp_path / "cluster-tests").write_text(listing)
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False))
    sched = ClusterScheduling(config, None, tmp_path / "cluster-tests", frozenset({"tests/test_elastic.py"}), slots=slots)
    nodes = [Worker(f"gw{i}", collection) for i in range(workers)]
    for node in nodes:
        node.sched = sched
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    return sched, nodes


def run_all(sched: ClusterScheduling, nodes: list[Worker]) -> None:
    """Complete each worker's tests in turn, one per worker per round, as their reports would
    arrive, until all stop. A worker with nothing to run only gets work when some test completes."""
    for _ in range(100):
        busy = [n for n in nodes if not n.shutting_down]
        if not busy:
            return
        progressed = False
        for node in busy:
            for unit in list(sched.assigned_work[node].values()):
                todo = [nodeid for nodeid, done in unit.items() if not done]
                if todo:
                    sched.mark_test_complete(node, node.collection.index(todo[0]))
                    progressed = True
                    break
        if not progressed:
            raise AssertionError(f"stalled: {[n.gateway.id for n in busy]} wait with nothing to run")
    raise AssertionError("the workers never stopped")


def ran_by(node: Worker) -> list[str]:
    return [t for batch in node.sent for t in batch]


def test_slot_zero_takes_its_own_cluster_tests_and_the_other_worker_the_either_cluster_ones(tmp_path: Path) -> None:
    sched, (gw0, gw1) = scheduler(tmp_path)
    sched.schedule()
    # first units: slot 0's module to gw0, an either-cluster module to gw1 (then, with only two
    # tests queued, each asks for one more: an either-cluster one before any pure test)
    assert gw0.sent[0] == ["tests/test_check.py::test_one", "tests/test_check.py::test_two"]
    assert gw1.sent[0] == ["tests/test_comm.py::test_hooks", "tests/test_comm.py::test_hier"]
    assert [batch for node in (gw0, gw1) for batch in node.sent[1:]] == [["tests/test_elastic.py::test_a"],
                                                                          ["tests/test_elastic.py::test_b"]]
    run_all(sched, [gw0, gw1])
    ran = {"gw0": ran_by(gw0), "gw1": ran_by(gw1)}
    assert sorted(ran["gw0"] + ran["gw1"]) == sorted(COLLECTION)  # each test once
    slot0 = [t for t in COLLECTION if t.startswith("tests/test_check.py")]
    assert not set(slot0) & set(ran["gw1"])
    # every cluster test before any pure test, on each worker
    for tests in ran.values():
        kinds = ["pure" if "pure" in t else "cluster" for t in tests]
        assert kinds == sorted(kinds), tests
    assert gw0.shutting_down and gw1.shutting_down


def test_a_worker_past_the_last_slot_gets_pure_tests_only_and_stops(tmp_path: Path) -> None:
    sched, nodes = scheduler(tmp_path, workers=3)
    sched.schedule()
    run_all(sched, nodes)
    ran_by_gw2 = ran_by(nodes[2])
    assert ran_by_gw2 and all("pure" in t for t in ran_by_gw2)
    assert all(n.shutting_down for n in nodes)


def test_with_three_slots_two_workers_share_the_either_cluster_tests_and_the_fourth_runs_pure_ones(tmp_path: Path) -> None:
    sched, nodes = scheduler(tmp_path, workers=4, slots=3)
    gw0, gw1, gw2, gw3 = nodes
    sched.schedule()
    assert gw0.sent[0] == ["tests/test_check.py::test_one", "tests/test_check.py::test_two"]
    firsts = [gw1.sent[0], gw2.sent[0]]
    assert ["tests/test_comm.py::test_hooks", "tests/test_comm.py::test_hier"] in firsts
    assert all(not t.startswith("tests/test_check.py") and "pure" not in t for batch in firsts for t in batch)
    assert all("pure" in t for t in ran_by(gw3))
    run_all(sched, nodes)
    ran = [ran_by(n) for n in nodes]
    assert sorted(t for tests in ran for t in tests) == sorted(COLLECTION)  # each test once
    assert not {t for tests in ran[1:] for t in tests if t.startswith("tests/test_check.py")}
    assert all(n.shutting_down for n in nodes)


ALONE_COLLECTION = [
    "tests/test_a.py::test_pure_1",
    "tests/test_b.py::test_pure_2",
    "tests/test_check.py::test_one",         # slot 0, one module unit
    "tests/test_check.py::test_two",         # slot 0
    "tests/test_check.py::test_three",       # slot 0
    "tests/test_comm.py::test_hooks",        # either
    "tests/test_scale.py::test_sixteen",     # alone, one module unit
    "tests/test_scale.py::test_thirty_two",  # alone
    "tests/test_scale.py::test_down",        # alone
    "tests/test_y.py::test_pure_3",
    "tests/test_z.py::test_pure_4",
]
ALONE_LISTING = "0 tests/test_check.py::test_one\n0 tests/test_check.py::test_two\n0 tests/test_check.py::test_three\n* tests/test_comm.py::test_hooks\n! tests/test_scale.py::test_sixteen\n" \
                "! tests/test_scale.py::test_thirty_two\n! tests/test_scale.py::test_down\n"


def test_an_alone_unit_runs_first_beside_pure_tests_only_and_the_waiting_worker_goes_on(tmp_path: Path) -> None:
    sched, (gw0, gw1) = scheduler(tmp_path, collection=ALONE_COLLECTION, listing=ALONE_LISTING)
    sched.schedule()
    alone = [t for t in ALONE_COLLECTION if t.startswith("tests/test_scale.py")]
    assert gw0.sent[0] == alone  # asked first, nothing else is running yet
    assert gw1.sent == [["tests/test_a.py::test_pure_1"], ["tests/test_b.py::test_pure_2"]]
    run_all(sched, [gw0, gw1])
    # holding the alone unit, gw0 asked for a pure test to follow it, then for its slot-0 unit; gw1
    # ran out of pure tests while the alone unit ran: it waited, then took the either-cluster test
    assert ran_by(gw0) == alone + ["tests/test_y.py::test_pure_3"] + [
        f"tests/test_check.py::test_{n}" for n in ("one", "two", "three")]
    assert ran_by(gw1) == [f"tests/test_{m}.py::test_pure_{n}" for m, n in (("a", 1), ("b", 2), ("z", 4))] + [
        "tests/test_comm.py::test_hooks"]
    assert sorted(ran_by(gw0) + ran_by(gw1)) == sorted(ALONE_COLLECTION)
    # never a cluster test sent while another worker had an alone unit, nor an alone unit while
    # another worker had cluster tests
    for node in (gw0, gw1):
        for test, elsewhere in node.beside:
            kind = "pure" if "pure" in test else "alone" if test in alone else "cluster"
            assert kind == "pure" or ALONE not in elsewhere, (node.gateway.id, test, elsewhere)
            assert kind != "alone" or not elsewhere, (node.gateway.id, test, elsewhere)
    assert gw0.shutting_down and gw1.shutting_down


def test_what_a_worker_may_take_while_the_others_hold_cluster_units(tmp_path: Path) -> None:
    sched, (gw0, gw1, gw2) = scheduler(tmp_path, workers=3)
    assert sched._wanted(gw0, set()) == [ALONE, SLOT0, EITHER, WAITS, PURE]
    assert sched._wanted(gw1, set()) == [ALONE, EITHER, WAITS, PURE]
    assert sched._wanted(gw1, {SLOT0}) == [EITHER, WAITS, PURE]  # no alone unit beside cluster tests
    assert sched._wanted(gw0, {EITHER}) == [SLOT0, EITHER, WAITS, PURE]
    assert sched._wanted(gw0, {ALONE, EITHER}) == [WAITS, PURE]  # no cluster test beside an alone unit
    assert sched._wanted(gw2, set()) == [WAITS, PURE]  # past the last slot
    assert sched._wanted(gw1, set(), {ALONE}) == [WAITS, PURE, ALONE, EITHER]  # its next test: a pure one


def test_the_pure_tests_that_wait_come_before_the_other_pure_tests(tmp_path: Path) -> None:
    """A test marked `waits` (listed "~") sorts late by name, yet the pure worker takes it first: it
    waits beside the cluster tests' CPU rather than in the run's last minute with the cores idle."""
    collection = [*COLLECTION, "tests/test_zz.py::test_pure_waits_1", "tests/test_zz.py::test_pure_waits_2"]
    listing = LISTING + "~ tests/test_zz.py::test_pure_waits_1\n~ tests/test_zz.py::test_pure_waits_2\n"
    sched, nodes = scheduler(tmp_path, workers=3, collection=collection, listing=listing)
    sched.schedule()
    run_all(sched, nodes)
    assert ran_by(nodes[2])[:2] == ["tests/test_zz.py::test_pure_waits_1", "tests/test_zz.py::test_pure_waits_2"]
    assert sorted(t for n in nodes for t in ran_by(n)) == sorted(collection)  # each test once
    assert all(n.shutting_down for n in nodes)
