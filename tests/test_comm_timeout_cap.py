"""`fab train --comm`'s own raise of `dist.timeout` (sec51 finding 1): each host reports its own link,
and one answering `mbit_s: 1e-9, connect_ms: 600000` raised the whole job's timeout to a day, said
in an INFO line naming no link, and a plain `--resume` kept it after that host was dropped. Now the
raise stops at AUTO_RAISE_MAX_S with a WARN naming the link, every line names the links that set
the floor, and a resume holds a recorded raise to the cap. Exact equality on the pure functions;
`choose` with only its link measurement a stand-in (the hosts' answers parsed by the real reader)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from meshrun.deploy.check.answers import link_results
from meshrun.deploy.edges import comm
from meshrun.deploy.edges.comm import Gradients, choose, floor_links, timeout_advice, timeout_line
from meshrun.deploy.run import commplan
from meshrun.deploy.run.commplan import Collective, Hook, TimeoutAdvice, largest_collective, plan, site_links
from meshrun.deploy.run.plan import Workload, trainer_args
from meshrun.deploy.run.workload import AUTO_RAISE_MAX_S, ResumedWork, resumed_work
from tests.test_comm_sync_bn import Lines
from tests.test_comm_timeout import RESNET101, S, VIT_B_16

MODEL_25M = ((5000, 5000), (5000,))  # 100.02 MB of fp32 gradients: 4 DDP buckets
FULL = 100_020_000


def answered(source: str, target: str, mbit_s: float, connect_ms: float) -> tuple:
    """One host's link-probe answer about one target, read by check-network's own reader."""
    link, = link_results(source, [{"name": target, "address": "10.0.0.9", "port": 40000}],
                         [{"state": "open", "connect_ms": connect_ms, "mbit_s": mbit_s}], None)
    return link.source, link.target, link.mbit_s, link.connect_ms


def chosen(monkeypatch: pytest.MonkeyPatch, hook: str, links: tuple, shapes=MODEL_25M, timeout_s: int = 60,
           sites: dict[str, str | None] | None = None) -> tuple[Workload, commplan.CommPlan, list[str]]:
    """`choose` as `fab train --comm HOOK` (no --timeout typed) calls it, the matrix `links` measured."""
    measured = (commplan.node_bandwidth((a, m) for a, _, m, _ in links), commplan.link_rtt(r for *_, r in links),
                links)
    monkeypatch.setattr(comm, "measure_links", lambda selection, sessions: measured)
    names = sites or {"h1": None, "h2": None}
    selection = SimpleNamespace(hosts=tuple(SimpleNamespace(name=n, site=s) for n, s in names.items()))
    said = Lines()
    workload, got = choose(hook, selection, {}, Workload(), None, said,  # type: ignore[arg-type]
                           Gradients(tuple(shapes), S), timeout_s=timeout_s, timeout_given=False)
    assert got is not None
    return workload, got, said.lines


HOSTILE = (answered("h1", "h2", 900.0, 20.0), answered("h2", "h1", 1e-9, 600_000))  # the finding's answers
SECONDS = FULL / 125.0 + 4 * 1 * 600.0  # 1 kbit/s (the least a link is held to), 4 buckets of 10 min RTT


def test_the_raise_stops_at_the_cap_and_the_need_is_still_said() -> None:
    c = Collective("a full-gradient all-reduce step", FULL, 125.0, SECONDS)
    assert timeout_advice(c, 60.0, False) == TimeoutAdvice(c, 60.0, False, 86_400, AUTO_RAISE_MAX_S)
    assert AUTO_RAISE_MAX_S == 1800
    assert timeout_advice(c, 3600.0, False) == TimeoutAdvice(c, 3600.0, False, 86_400, None)  # over the cap already
    assert timeout_advice(c, 60.0, True) == TimeoutAdvice(c, 60.0, True, 86_400, None)  # the user's: never raised
    honest = dataclasses.replace(c, seconds=599.0)  # 3x that is 1797 s: under the cap, raised all the way
    assert timeout_advice(honest, 60.0, False) == TimeoutAdvice(honest, 60.0, False, 1797, 1797)


def test_a_host_answering_1e_9_mbit_gets_the_cap_and_a_warn_naming_its_link(monkeypatch: pytest.MonkeyPatch) -> None:
    workload, got, lines = chosen(monkeypatch, "none", HOSTILE)
    assert workload.args == ("dist.timeout=1800", "comm.hook=none")
    assert got.timeout == TimeoutAdvice(Collective("a full-gradient all-reduce step", FULL, 125.0, SECONDS),
                                        60.0, False, 86_400, 1800)
    assert lines[-1] == (
        "WARN comm: dist.timeout raised to 1800 s only, the most the controller sets on its own (each host reports "
        "its own link): under 3x the largest collective, a full-gradient all-reduce step, 100.0 MB over the slowest "
        "link (0.001 Mbit/s on h2 -> h1; round trip 600000.0 ms on h2 -> h1), takes about 802560 s; check that "
        "link, and if it really is that slow pass --timeout 86400")


def test_a_timeout_already_over_the_cap_is_not_raised_and_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run's recorded --timeout (not typed now) over the cap: nothing added, the need said."""
    workload, _, lines = chosen(monkeypatch, "none", HOSTILE, timeout_s=3600)
    assert workload.args == ("comm.hook=none",)
    assert lines[-1].startswith("WARN comm: dist.timeout 3600 s is under 3x the largest collective") and \
        lines[-1].endswith("(0.001 Mbit/s on h2 -> h1; round trip 600000.0 ms on h2 -> h1), takes about 802560 s: "
                           "the run may stop with a collective timeout; set --timeout 86400")


def test_an_honest_raise_under_the_cap_is_info_naming_the_slowest_hosts_best_link(
        monkeypatch: pytest.MonkeyPatch) -> None:
    links = (answered("h1", "h2", 20.0, 40.0), answered("h2", "h1", 50.0, 30.0))  # h1's best is the slowest
    workload, _, lines = chosen(monkeypatch, "auto", links, shapes=VIT_B_16)
    assert workload.args == ("dist.timeout=418", "comm.hook=powersgd")  # docs/performance.md's case, as before
    assert lines[-1] == (
        "comm: dist.timeout raised to 418 s: the largest collective, a powersgd warm-up step (full all-reduce), "
        "346.3 MB over the slowest link (20.0 Mbit/s on h1 -> h2; round trip 40.0 ms on h1 -> h2), takes about "
        "139 s (3x that; --timeout sets another)")


def test_a_round_trip_alone_is_named_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """h2 answers a fast link with a 10 min handshake: the bandwidth's links are honest, the RTT's is h2's."""
    links = (answered("h1", "h2", 900.0, 20.0), answered("h2", "h1", 900.0, 600_000))
    workload, got, lines = chosen(monkeypatch, "none", links)
    assert workload.args == ("dist.timeout=1800", "comm.hook=none")
    assert got.timeout is not None and got.timeout.needed_s == 7203  # 3x (0.89 s + 4 x 600 s)
    assert "(900.0 Mbit/s on h1 -> h2, h2 -> h1; round trip 600000.0 ms on h2 -> h1)" in lines[-1]
    assert lines[-1].startswith("WARN comm: dist.timeout raised to 1800 s only")


def test_the_broadcast_names_no_round_trip() -> None:
    """fp16's largest is DDP's initial broadcast, S / B: no round trip in it."""
    links = (("h1", "h2", 20.0, 40.0), ("h2", "h1", 20.0, 40.0))
    got = dataclasses.replace(plan(2.5e6, 2, RESNET101, S, rtt_s=0.04), links=links)
    c = largest_collective(got, Hook.FP16, S)
    assert c.what == "DDP's initial broadcast of the parameters"
    assert floor_links(got, Hook.FP16, c, {"h1": "host:h1", "h2": "host:h2"}) == " on h1 -> h2, h2 -> h1"


SITES = {"a1": "office", "a2": "office", "b1": "home"}


def sited(inside_mbit: float) -> tuple[tuple[str, str, float, float], ...]:
    inside = [("a1", "a2", inside_mbit, 0.5), ("a2", "a1", inside_mbit, 0.5)]
    between = [("a1", "b1", 30.0, 40.0), ("a2", "b1", 25.0, 41.0), ("b1", "a1", 20.0, 42.0), ("b1", "a2", 20.0, 39.0)]
    return tuple(inside + between)


@pytest.mark.parametrize("inside_mbit, what, named", [
    (1000.0, "hier's outer all-reduce between sites", " on b1 -> a1, b1 -> a2; round trip 42.0 ms on b1 -> a1"),
    # a slow LAN: the step inside a site is the largest; all links' bests (a1: 30) would name no link
    (10.0, "a full-gradient all-reduce step inside a site", " on a1 -> a2, a2 -> a1; round trip 0.5 ms on a1 -> a2, "
                                                            "a2 -> a1"),
])
def test_hier_names_the_links_between_or_inside_sites_that_set_it(inside_mbit: float, what: str, named: str) -> None:
    links = sited(inside_mbit)
    bandwidth = commplan.node_bandwidth((a, m) for a, _, m, _ in links)
    got = dataclasses.replace(plan(bandwidth, 3, VIT_B_16, S, rtt_s=0.042, sites=site_links(links, SITES)),
                              links=links)
    c = largest_collective(got, Hook.HIER, S)
    assert c.what == what
    assert floor_links(got, Hook.HIER, c, SITES) == named


def test_the_lines_show_a_kbit_link_as_itself() -> None:
    c = Collective("a full-gradient all-reduce step", FULL, 125.0, SECONDS)
    assert "(0.001 Mbit/s), takes" in timeout_line(timeout_advice(c, 60.0, False))  # was "(0.0 Mbit/s)"


RAISED = Workload(args=("dist.timeout=1800", "comm.hook=powersgd", "optim.lr=0.1"))  # as `choose` records it


def test_a_plain_resume_keeps_the_raise_held_to_the_cap() -> None:
    """`fab train --resume R`: the raise stands (an honest slow link still needs it), but one a record
    from before the cap holds (a day, one host's word) is held to the cap, and the note says so."""
    plain = resumed_work("R", RAISED, 60, Workload(), None, new_comm=False)
    assert plain == ResumedWork(RAISED, 60, "resume: run R runs as it ran: the built-in trainer -- "
                                "dist.timeout=1800 comm.hook=powersgd optim.lr=0.1")
    old = Workload(args=("dist.timeout=86400", "comm.hook=powersgd", "optim.lr=0.1"))
    held = resumed_work("R", old, 60, Workload(), None, new_comm=False)
    assert held == ResumedWork(RAISED, 60, (
        "resume: run R runs as it ran: the built-in trainer -- dist.timeout=1800 comm.hook=powersgd optim.lr=0.1; "
        "dist.timeout=86400 (--comm's raise, from the links each host reported) is held to dist.timeout=1800: pass "
        "--timeout N if the links really are that slow"))
    assert trainer_args(held.workload, held.pg_timeout_s) == ["dist.timeout=60", "dist.timeout=1800",
                                                              "comm.hook=powersgd", "optim.lr=0.1"]
    own = resumed_work("R", old, 60, Workload(args=("dist.timeout=300",)), None, new_comm=False)
    assert own.workload.args[0] == "dist.timeout=1800" and own.workload.args[-1] == "dist.timeout=300"  # the last wins


def test_the_users_own_timeout_is_kept_on_resume() -> None:
    typed = resumed_work("R", RAISED, 60, Workload(), 900, new_comm=False)
    assert typed == ResumedWork(Workload(args=("comm.hook=powersgd", "optim.lr=0.1")), 900,
                                "resume: run R runs as it ran: the built-in trainer -- comm.hook=powersgd optim.lr=0.1")
    again = resumed_work("R", RAISED, 60, Workload(), None, new_comm=True)  # --comm: choose raises anew
    assert again == ResumedWork(Workload(args=("optim.lr=0.1",)), 60,
                                "resume: run R runs as it ran: the built-in trainer -- optim.lr=0.1")
    own = Workload(args=("comm.hook=powersgd", "dist.timeout=100"))  # the user's, after the hook: never the raise
    assert resumed_work("R", own, 60, Workload(), None, new_comm=False) == ResumedWork(
        own, 60, "resume: run R runs as it ran: the built-in trainer -- comm.hook=powersgd dist.timeout=100")
