"""A host of an elastic attached run whose agent ended by itself without finishing gets a stop.

SIGKILLed (the OOM killer), an agent stops nothing: the kernel ends its torchrun and workers, but
what a rank started in a session of its own runs on, re-parented to init and tagged with the run.
Over SSH such an end has no exit status (paramiko drops the exit-signal: rc -1). A fixed run's
failure stops every host; an elastic run went on, said only "lost: exit status -1", and never sent
that host a stop. Fake sessions stand in for SSH (tests/fakesession.py): what is under test is the
launcher's bookkeeping, which stop it sends where and what the timeline says; the agent's stop is
tested on real processes elsewhere (tests/test_agent_safety.py)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import ElasticBounds, Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.membership import KILLED_DETAIL, Change, LeftStop, how_it_ended, stop_detail, stops_after
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, agent_verb_argv, plan_launch
from meshrun.deploy.run.summary import build_summary
from meshrun.layout import AGENT_BUSY_EXIT, STOP_GRACE_S
from tests.fakesession import FakeSession, host

CLEAN = '{"host": "h2", "run_id": "r1", "was_running": true, "remaining": []}'
AGAIN = "once the run has ended, run fab stop --run r1"


class GatedStream:
    """An agent that trains until `gate` is set (or its stdin is closed), then finishes with status 0."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def readline(self) -> bytes:
        self.gate.wait(10)  # bounds a run whose stop never comes (the old code): it fails, never hangs
        return b""

    def send(self, data: bytes, timeout: float = 0.0) -> bool:
        return True

    def close_stdin(self) -> None:
        self.gate.set()

    def poll(self) -> int | None:
        return 0 if self.gate.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        return 0

    def abandon(self) -> None:
        self.gate.set()


class Member(FakeSession):
    """A host whose agent ends with `rc` at once (None: it trains until the gate opens), and whose
    every command (the agent's stop) is recorded and answered with `answer`, or fails with it. One
    that is not `reachable` answers no probe either."""

    def __init__(self, the_host: Host, rc: int | None, gate: threading.Event, answer: str | MeshrunError,
                 reachable: bool = True) -> None:
        super().__init__("", 0 if rc is None else rc, the_host)
        self.agent_rc, self.gate, self.answer, self.reachable = rc, gate, answer, reachable
        self.ran: list[tuple[str, ...]] = []
        self.claim_meanwhile: str | None = "not asked"
        self.other_claim_meanwhile: str | None = "not asked"
        self.runner: JobRunner | None = None

    def start(self, argv: Sequence[str]):  # type: ignore[no-untyped-def,override]
        return GatedStream(self.gate) if self.agent_rc is None else super().start(argv)

    def ping(self, timeout: float) -> bool:
        if not self.reachable:
            self.gate.set()  # asked, and gave no answer: the others may finish
        return self.reachable

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        self.ran.append(tuple(argv))
        if self.runner is not None and self.agent_rc is not None:
            self.claim_meanwhile = self.runner.claim(self.host.name)  # a `fab join` of it while it is being stopped
            # A join of another host meanwhile: this one, being stopped, takes no place under the maximum.
            self.other_claim_meanwhile = self.runner.claim("h4")
            self.runner.unclaim("h4")
        self.gate.set()  # the others finish only now: the run went on while this host was lost
        if isinstance(self.answer, MeshrunError):
            raise self.answer
        return CommandResult(0, self.answer + "\n", "")


def hosts() -> tuple[Host, ...]:
    return tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.147.17.{i}") for i in (1, 2, 3))


def plan(elastic: ElasticBounds | None) -> LaunchPlan:
    return plan_launch(Selection(hosts(), Rendezvous("h1", 29400)), LaunchOptions("r1", elastic=elastic), {}, "/p")


def run(tmp_path: Path, elastic: ElasticBounds | None, rc: int, answer: str | MeshrunError = CLEAN,
        reachable: bool = True, cut: bool = False) -> tuple[JobOutcome, dict[str, Member], list[str]]:
    """h1 and h3 train until h2 is stopped (or, in a fixed run, until stop_all); h2's agent ends with `rc`.
    `cut`: the probe lost h2 first (its stream dropped), and h1 and h3 finish once its loss is recorded."""
    gate, lines = threading.Event(), []
    the_plan = plan(elastic)
    sessions = {h.name: Member(h, rc if h.name == "h2" else None, gate, answer, reachable or h.name != "h2")
                for h in hosts()}
    runner = JobRunner(the_plan, sessions, lambda _h, line: lines.append(line), tmp_path, "/p",
                       notify=lambda event: cut and event.host == "h2" and gate.set())
    sessions["h2"].runner = runner
    runner.hosts[1].lost = cut
    return runner.run(), sessions, lines


def stop_argv(name: str) -> tuple[str, ...]:
    the_host = next(h for h in hosts() if h.name == name)
    return tuple(agent_verb_argv(the_host, "stop", "r1", "/p", STOP_GRACE_S))


def ends(outcome: JobOutcome) -> list[tuple[str, str, str | None]]:
    return [(e.event.value, e.host, e.detail) for e in outcome.events if e.event is not Change.STARTED]


@pytest.mark.parametrize("rc,why", [(-1, KILLED_DETAIL), (-9, KILLED_DETAIL)])
def test_a_host_whose_agent_ended_by_itself_is_stopped_while_the_others_go_on(
        tmp_path: Path, rc: int, why: str) -> None:
    outcome, sessions, lines = run(tmp_path, ElasticBounds(2, 3), rc)
    assert outcome.status is JobStatus.SUCCEEDED
    assert sessions["h2"].ran == [stop_argv("h2")]
    assert sessions["h1"].ran == sessions["h3"].ran == []
    assert sessions["h2"].claim_meanwhile == "host 'h2' is being stopped (what its last agent left); try again in a minute"
    assert sessions["h2"].other_claim_meanwhile is None  # 2 running of at most 3: room for h4
    said = f"{why}; stopped what it left"
    assert ends(outcome) == [("lost", "h2", said), ("finished", "h1", None), ("finished", "h3", None)]
    assert f"[h2] meshrun: {said}" in lines
    h2 = next(h for h in outcome.hosts if h.host == "h2")
    assert (h2.rc, h2.remaining, h2.stop_error) == (rc, (), None)
    summary = build_summary(plan(ElasticBounds(2, 3)), outcome, None)
    assert [(t["event"], t["host"], t["detail"]) for t in summary.timeline][3] == ("lost", "h2", said)
    assert summary.lost_hosts == ["h2"]


def test_a_stop_that_fails_says_how_to_stop_what_is_left(tmp_path: Path) -> None:
    outcome, sessions, lines = run(tmp_path, ElasticBounds(2, 3), -1,
                                   MeshrunError("host 'h2': the SSH connection dropped"))
    assert sessions["h2"].ran == [stop_argv("h2")]
    failed = f"stopping what it left failed: host 'h2': the SSH connection dropped; {AGAIN}"
    assert ends(outcome)[0] == ("lost", "h2", f"{KILLED_DETAIL}; {failed}")
    assert f"[h2] meshrun: {KILLED_DETAIL}; {failed}" in lines
    h2 = next(h for h in outcome.hosts if h.host == "h2")
    assert (h2.remaining, h2.stop_error) == ((), failed)


def test_a_host_that_does_not_answer_is_not_sent_a_stop(tmp_path: Path) -> None:
    outcome, sessions, _lines = run(tmp_path, ElasticBounds(2, 3), -1, reachable=False)
    assert sessions["h2"].ran == []
    assert ends(outcome)[0] == ("lost", "h2", f"{KILLED_DETAIL}; stopping what it left failed: host 'h2' does not "
                                              f"answer; {AGAIN}")


def test_a_host_the_probe_lost_is_unreachable_and_gets_no_stop(tmp_path: Path) -> None:
    """A cut host's dropped stream can end with rc -1 too; its agent lives, and stops itself once the
    heartbeats stop. Not "killed?", and no stop that could only wait on the cut link."""
    outcome, sessions, _lines = run(tmp_path, ElasticBounds(2, 3), -1, cut=True)
    assert sessions["h2"].ran == []
    assert ends(outcome)[0] == ("lost", "h2", "unreachable")


def test_what_outlives_the_stop_is_named(tmp_path: Path) -> None:
    outcome, _sessions, _lines = run(tmp_path, ElasticBounds(2, 3), -1, '{"remaining": [4242]}')
    assert ends(outcome)[0] == (
        "lost", "h2", f"{KILLED_DETAIL}; 1 process(es) of the run outlived the stop of what it left (4242); {AGAIN}")
    assert next(h for h in outcome.hosts if h.host == "h2").remaining == (4242,)


def test_a_fixed_run_still_fails_and_stops_every_host_once(tmp_path: Path) -> None:
    outcome, sessions, _lines = run(tmp_path, None, -1)
    assert (outcome.status, outcome.failed_host, outcome.reason) == (
        JobStatus.FAILED, "h2", "host 'h2' exited with status -1")
    assert {name: s.ran for name, s in sessions.items()} == {name: [stop_argv(name)] for name in ("h1", "h2", "h3")}
    assert ends(outcome)[0] == ("lost", "h2", KILLED_DETAIL)  # stop_all's stop: no stop of its own


def test_which_ends_get_a_stop() -> None:
    # An agent that ended with a status of its own swept its run's processes as it ended (a refused rendezvous
    # state, failed workers, its own SIGTERM): only one killed outright left them.
    assert [stops_after(rc, leaving=False, outlived=False) for rc in (-1, -9, 1, 65, 143, 0, None, AGENT_BUSY_EXIT)] == [
        True, True, False, False, False, False, False, False]
    assert not stops_after(-1, leaving=True, outlived=False)  # `fab leave` stopped it
    assert not stops_after(-1, leaving=False, outlived=True)  # stopped: it outlived the training
    assert how_it_ended(-1, leaving=False, outlived=False) == (Change.LOST, KILLED_DETAIL)
    assert how_it_ended(-1, leaving=False, outlived=False, training_done=True) == (
        Change.FINISHED, f"ended after training had finished ({KILLED_DETAIL})")


def test_the_stop_in_the_timeline() -> None:
    assert stop_detail("exit status 1", None, "r1") == "exit status 1; stopping what it left"
    assert stop_detail(KILLED_DETAIL, LeftStop(), "r1") == f"{KILLED_DETAIL}; stopped what it left"
    assert stop_detail(None, LeftStop(error="host 'h2' does not answer"), "r1") == (
        f"stopping what it left failed: host 'h2' does not answer; {AGAIN}")
    assert stop_detail("x", LeftStop(remaining=(7, 8)), "r1") == (
        f"x; 2 process(es) of the run outlived the stop of what it left (7, 8); {AGAIN}")
