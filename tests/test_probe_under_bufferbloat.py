"""Liveness probes on a home or cross-continent link whose uplinks the run's own all-reduce fills
(bufferbloat: 0.5-2.5 s of queueing, RTT up to 300 ms, a SYN dropped by a full queue resent by
Linux after 1 s). A live host behind such a link must never be counted lost: the agents' probe of
the rendezvous store and of their peers (deploy/host/succession.py) killed healthy workers and split
the run, and the controller's SSH probe (deploy/edges/launcher.py) failed a healthy attached run. A
cut link must still be noticed, after a bounded number of full timeouts.

The delays are decided, not waited out: a fake connect (or ping) answers when the timeout it is
given covers the link's delay, and times out otherwise, so the test reads the decision, not a
clock. One test uses a real socket whose accept queue is full, where the kernel itself drops SYNs.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.edges import launcher
from meshrun.deploy.edges.launcher import JobRunner, _Live
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.host import succession
from meshrun.deploy.host.succession import HeadWatcher, PeerWatcher, store_answers
from meshrun.deploy.inventory.model import ElasticBounds, Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch

RTT_S = 0.3
QUEUE_S = 2.5  # one saturated uplink
ONE_QUEUE = QUEUE_S + RTT_S  # the SYN-ACK queued behind the store host's all-reduce
SYN_RESENT = 1.0 + ONE_QUEUE  # the first SYN dropped by a full queue, resent after 1 s
TWO_QUEUES = 2 * QUEUE_S + RTT_S  # controller uploading too: request and answer both queue


class Link:
    """`socket.create_connection` over a link: answers after `delay` s (None: never, a cut link)."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.timeouts: list[float] = []  # each probe's timeout, in order
        self.missed: list[float] = []  # the timeout of each probe that timed out, in order
        self.lock = threading.Lock()

    def __call__(self, address: tuple[str, int], timeout: float) -> contextlib.nullcontext:
        with self.lock:
            self.timeouts.append(timeout)
        time.sleep(0.001)  # the watcher's pause is shortened; keep the loop from spinning
        if self.delay is None or self.delay > timeout:
            with self.lock:  # recorded as decided: a probe begun before the cut may time out after it
                self.missed.append(timeout)
            raise TimeoutError("timed out")
        return contextlib.nullcontext()

    def probes(self) -> int:
        with self.lock:
            return len(self.timeouts)


@pytest.fixture(autouse=True)
def fast_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the pause between probes is shortened; each probe keeps its real timeout."""
    monkeypatch.setattr(succession, "PROBE_EVERY_S", 0.005)


def until(condition, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@pytest.mark.parametrize("delay", [ONE_QUEUE, SYN_RESENT], ids=["queued-syn-ack", "first-syn-dropped"])
def test_a_store_behind_a_saturated_uplink_is_never_lost(monkeypatch: pytest.MonkeyPatch, delay: float) -> None:
    link = Link(0.0)  # idle link: the store is seen up
    monkeypatch.setattr(succession.socket, "create_connection", link)
    watcher = HeadWatcher("10.0.0.1:29400")
    try:
        assert until(lambda: watcher.seen)
        link.delay, before = delay, link.probes()  # the all-reduce fills the uplinks
        assert until(lambda: link.probes() >= before + 30)  # a long all-reduce: many slow probes in a row
        assert (watcher.seen, watcher.lost) == (True, False)
        assert watcher.confirm_lost() is False  # torchrun failed by itself: its store still answers
    finally:
        watcher.stop()


@pytest.mark.parametrize("delay", [ONE_QUEUE, SYN_RESENT], ids=["queued-syn-ack", "first-syn-dropped"])
def test_a_peer_behind_a_saturated_uplink_is_never_reported(monkeypatch: pytest.MonkeyPatch, delay: float) -> None:
    link = Link(0.0)
    monkeypatch.setattr(succession.socket, "create_connection", link)
    watcher = PeerWatcher({"h2": "10.0.0.2:22"})
    try:
        assert until(lambda: link.probes() >= 3)  # seen up on an idle link (a peer never seen is never news)
        link.delay, before = delay, link.probes()
        assert until(lambda: link.probes() >= before + 30)
        assert watcher.take_lost() == []  # a detached run's workers are not killed for a busy link
    finally:
        watcher.stop()


def test_a_cut_store_is_lost_after_two_full_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen up, then cut (no reset): lost after MISSES_BEFORE_LOST probes, each given the full
    CONNECT_TIMEOUT_S, so at most LOST_WITHIN_S = 2 x (2 s pause + 6 s) = 16 s after the cut."""
    link = Link(0.0)
    monkeypatch.setattr(succession.socket, "create_connection", link)
    watcher = HeadWatcher("10.0.0.1:29400")
    try:
        assert until(lambda: watcher.seen)
        assert link.missed == []  # the idle link answered every probe
        link.delay = None
        assert until(lambda: watcher.lost)
        # Counted as each probe timed out, not as it began: one begun just before the cut, under a
        # loaded CI, timed out after it and was missed by a count taken at the cut.
        assert link.missed == [succession.CONNECT_TIMEOUT_S] * succession.MISSES_BEFORE_LOST
    finally:
        watcher.stop()
    assert succession.CONNECT_TIMEOUT_S == 6.0 and succession.MISSES_BEFORE_LOST == 2
    assert succession.LOST_WITHIN_S == 2 * (2.0 + 6.0)  # with the real pause (fixture set it to 0.005)


def test_a_killed_store_host_is_still_lost_on_its_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path: a killed host's port refuses at once, on a real socket."""
    store = socket.create_server(("127.0.0.1", 0))
    watcher = HeadWatcher(f"127.0.0.1:{store.getsockname()[1]}")
    try:
        assert until(lambda: watcher.seen)
        store.close()
        assert until(lambda: watcher.lost)
    finally:
        watcher.stop()
        store.close()


def full_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A real listener whose accept queue is full: the kernel drops every new SYN, like a queue
    that overflowed, and the connecting side resends at 1 s, then 3 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(server.getsockname())
        fillers.append(filler)
    time.sleep(0.2)
    return server, fillers


def drain_after(server: socket.socket, seconds: float, until_set: threading.Event) -> None:
    time.sleep(seconds)
    server.setblocking(False)
    while not until_set.is_set():
        try:
            server.accept()[0].close()
        except BlockingIOError:
            time.sleep(0.02)


@pytest.mark.skipif(sys.platform != "linux", reason="Linux drops a SYN when the accept queue is full")
def test_a_real_connect_outlasts_dropped_syns() -> None:
    """SYNs at 0 s and 1 s are dropped; the queue frees at 1.5 s; the resend at 3 s is answered.
    The old 2 s probe called that host gone; the probe's own default timeout waits for it."""
    server, fillers = full_listener()
    done = threading.Event()
    threading.Thread(target=drain_after, args=(server, 1.5, done), daemon=True).start()
    try:
        assert store_answers("127.0.0.1:%d" % server.getsockname()[1]) is True
    finally:
        done.set()
        for sock in (server, *fillers):
            sock.close()


@pytest.mark.skipif(sys.platform != "linux", reason="Linux drops a SYN when the accept queue is full")
def test_a_blackholed_store_is_a_miss_not_a_hang() -> None:
    server, fillers = full_listener()  # never drained: every SYN vanishes, as on a cut link
    try:
        assert store_answers("127.0.0.1:%d" % server.getsockname()[1], timeout=0.5) is False
    finally:
        for sock in (server, *fillers):
            sock.close()


# The controller's probe: a fresh SSH channel on the agent's connection (deploy/edges/launcher.py).

class QuietStream:
    def __init__(self) -> None:
        self.abandoned = False

    def send(self, data: bytes, timeout: float = 0.0) -> bool:
        return True

    def abandon(self) -> None:
        self.abandoned = True


class SlowSession:
    """A host whose sshd grants a channel after `delay` s (None: never, a cut link)."""

    def __init__(self, host: Host, delay: float | None) -> None:
        self.host, self.delay = host, delay
        self.timeouts: list[float] = []

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        return CommandResult(0, "", "")

    def ping(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return self.delay is not None and self.delay <= timeout

    def close(self) -> None:
        pass


def watched_host(tmp_path: Path, delay: float | None) -> tuple[JobRunner, _Live, SlowSession]:
    """Host b of an elastic job of a and b, its agent's stream stubbed; the watch loop's probe is called by hand."""
    hosts = tuple(Host(name, address, ssh_address=None, user="root", port=22, identity=None, python="/venv/bin/python",
                       workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())
                  for name, address in (("a", "10.0.0.1"), ("b", "10.0.0.2")))
    plan = plan_launch(Selection(hosts, Rendezvous("a", 29400)), LaunchOptions("r1", elastic=ElasticBounds(1, 2)),
                       {}, "/p")
    sessions = {h.name: SlowSession(h, delay) for h in hosts}
    runner = JobRunner(plan, sessions, lambda _h, _l: None, tmp_path, "/venv/bin/python")
    live = runner.hosts[1]
    live.stream = QuietStream()  # type: ignore[assignment]
    return runner, live, sessions["b"]


@pytest.mark.parametrize("delay", [ONE_QUEUE, TWO_QUEUES], ids=["host-uplink", "both-uplinks"])
def test_the_controller_never_loses_a_host_behind_saturated_uplinks(tmp_path: Path, delay: float) -> None:
    runner, live, _session = watched_host(tmp_path, delay)
    for _ in range(30):
        runner._probe(live)
    assert (live.lost, live.cut, live.done.is_set(), live.missed_pings) == (False, False, False, 0)
    assert not live.stream.abandoned  # type: ignore[union-attr]


def test_the_controller_loses_a_cut_host_after_two_full_timeouts(tmp_path: Path) -> None:
    """Lost after PINGS_BEFORE_LOST probes, each given PING_TIMEOUT_S; probes start on a 2 s tick
    after the previous one ended, so at most LOST_WITHIN_S = 2 x (2 + 6) = 16 s after the cut."""
    runner, live, session = watched_host(tmp_path, None)
    probes = 0
    while not live.done.is_set() and probes < 10:
        runner._probe(live)
        probes += 1
    abandoned = live.stream.abandoned  # type: ignore[union-attr]
    assert (probes, live.lost, live.cut, abandoned) == (launcher.PINGS_BEFORE_LOST, True, True, True)
    assert session.timeouts == [launcher.PING_TIMEOUT_S] * launcher.PINGS_BEFORE_LOST
    assert (launcher.PING_TIMEOUT_S, launcher.PINGS_BEFORE_LOST, launcher.LOST_WITHIN_S) == (6.0, 2, 16.0)
