"""The test runner's scheduler (tests/clusterschedule.py) driven as pytest-xdist drives it, with two
stand-in workers: which tests each worker gets, in what order, and that both stop at the end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.clusterschedule import ClusterScheduling

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
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[str]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append([COLLECTION[i] for i in indices])

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(tmp_path: Path, workers: int = 2) -> tuple[ClusterScheduling, list[Worker]]:
    listing = tmp_path / "cluster-tests"
    listing.write_text(LISTING)
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False))
    sched = ClusterScheduling(config, None, listing, frozenset({"tests/test_elastic.py"}), slots=2)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    return sched, nodes


def run_all(sched: ClusterScheduling, nodes: list[Worker]) -> None:
    """Complete each worker's tests in turn, as their reports would arrive, until all stop."""
    for _ in range(100):
        busy = [n for n in nodes if not n.shutting_down]
        if not busy:
            return
        for node in busy:
            for scope, unit in sched.assigned_work[node].items():
                todo = [nodeid for nodeid, done in unit.items() if not done]
                if todo:
                    sched.mark_test_complete(node, COLLECTION.index(todo[0]))
                    break
            else:
                sched._reschedule(node)
    raise AssertionError("the workers never stopped")


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
    ran = {name: [t for batch in node.sent for t in batch] for name, node in (("gw0", gw0), ("gw1", gw1))}
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
    ran_by_gw2 = [t for batch in nodes[2].sent for t in batch]
    assert ran_by_gw2 and all("pure" in t for t in ran_by_gw2)
    assert all(n.shutting_down for n in nodes)
