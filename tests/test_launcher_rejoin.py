"""The controller starts a host that came back exactly once, however often its watcher looks.

Fake sessions stand in for SSH here: what is under test is the launcher's own bookkeeping (which
threads may start an agent, and when), and the race needs a stop that takes seconds, which a fake
makes deterministic. The real rejoin is proved end to end in test_elastic.py (test_b, test_d[cut]).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Sequence

from meshrun.deploy.edges.launcher import JobRunner, _Live
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import ElasticBounds, Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch


def host(name: str, address: str) -> Host:
    return Host(name, address, ssh_address=None, user="root", port=22, identity=None, python="/venv/bin/python",
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


class IdleStream:
    """An agent that says nothing until it is told to stop."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def readline(self) -> bytes:
        self.closed.wait(30)
        return b""

    def send(self, data: bytes, timeout: float = 0.0) -> bool:
        return True

    def close_stdin(self) -> None:
        self.closed.set()

    def poll(self) -> int | None:
        return 0 if self.closed.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        return 0 if self.closed.wait(timeout) else None

    def abandon(self) -> None:
        self.closed.set()


class SlowStopSession:
    """A reachable host whose `agent stop` takes `stop_s` (the old agent's grace period)."""

    def __init__(self, host: Host, stop_s: float, started: list[Sequence[str]]) -> None:
        self.host, self.stop_s, self.started = host, stop_s, started

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        time.sleep(self.stop_s)
        return CommandResult(0, "", "")

    def start(self, argv: Sequence[str]) -> IdleStream:
        self.started.append(tuple(argv))
        return IdleStream()

    def ping(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


def runner_with_b_cut(tmp_path: Path, stop_s: float, started: list[Sequence[str]]) -> tuple[JobRunner, _Live]:
    """An elastic job of a and b whose b was just cut off; a reconnected b's stop takes `stop_s`."""
    hosts = (host("a", "10.0.0.1"), host("b", "10.0.0.2"))
    plan = plan_launch(Selection(hosts, Rendezvous("a", 29400)), LaunchOptions("r1", elastic=ElasticBounds(1, 2)),
                       {}, "/p")
    sessions = {h.name: SlowStopSession(h, 0.0, started) for h in hosts}
    runner = JobRunner(plan, sessions, lambda _h, _l: None, tmp_path, "/venv/bin/python",
                       reconnect=lambda h: SlowStopSession(h, stop_s, started))
    lost: _Live = runner.hosts[1]
    lost.lost = lost.cut = lost.seen_down = True
    lost.done.set()
    return runner, lost


def test_a_host_back_from_a_cut_is_started_once_while_its_old_agent_is_being_stopped(tmp_path: Path) -> None:
    started: list[Sequence[str]] = []
    runner, lost = runner_with_b_cut(tmp_path, 1.0, started)
    for _ in range(20):  # the link watcher ticks many times during the one-second stop
        runner._maybe_rejoin(lost)
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while getattr(lost, "rejoining", False) and time.monotonic() < deadline:
        time.sleep(0.05)
    fresh = [live for live in runner.hosts if live.name == "b" and live is not lost]
    assert len(fresh) == 1 and lost.replaced and not lost.rejoining
    assert len(started) == 1 and runner.rejoins == {"b": 1}
    runner._maybe_rejoin(lost)  # replaced: never again
    time.sleep(0.2)
    assert len(started) == 1
    runner.stopping.set()
    for live in runner.hosts:
        if live.stream is not None:
            live.stream.abandon()


def test_a_leave_stops_the_agent_that_runs_not_the_one_that_was_lost(tmp_path: Path) -> None:
    """After a host came back, its name has two entries: the lost one and the running one. `fab
    leave` took the first, so it stopped through a dead session (the host trained on) or killed the
    new agent without marking it as leaving (a false loss)."""
    runner, lost = runner_with_b_cut(tmp_path, 0.0, [])
    runner._maybe_rejoin(lost)
    deadline = time.monotonic() + 5
    while not lost.replaced and time.monotonic() < deadline:
        time.sleep(0.05)
    fresh = [live for live in runner.hosts if live.name == "b" and live is not lost]
    assert len(fresh) == 1
    try:
        runner.remove_host("b")
        assert fresh[0].leaving and not lost.leaving
    finally:
        runner.stopping.set()
        for live in runner.hosts:
            if live.stream is not None:
                live.stream.abandon()


def test_a_join_and_a_return_reserve_the_host_and_the_room_before_they_start(tmp_path: Path) -> None:
    """A join prepares its host for seconds (sync, plan). Without a reservation a return of the same
    host, or a second join, started it twice meanwhile, or two joins both passed the maximum."""
    runner, lost = runner_with_b_cut(tmp_path, 0.0, [])  # a runs, b is lost; at most 2 hosts
    try:
        assert runner.claim("b") is None
        assert runner.claim("b") == "host 'b' is already in run r1, or being started"
        runner._maybe_rejoin(lost)  # b's return waits for the join that holds it
        time.sleep(0.2)
        assert not lost.rejoining and [h.name for h in runner.hosts] == ["a", "b"]
        assert runner.claim("c") == "run r1 already has its maximum of 2 hosts"  # a + the b being joined
        assert runner.claim("a") == "host 'a' is already in run r1, or being started"
        runner.unclaim("b")
        assert runner.claim("c") is None
    finally:
        runner.stopping.set()
        for live in runner.hosts:
            if live.stream is not None:
                live.stream.abandon()
