"""The edge that runs a launch plan: one agent per host, started in parallel, streamed live,
kept alive by heartbeats, and stopped everywhere on failure or Ctrl-C (SIGTERM, SIGHUP) with proof that no run
process is left.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from meshrun.layout import (AGENT_PEER_GONE_LINE, AGENT_RESTART_LINE, CONTROLLER_LOGS, HEARTBEAT_EVERY_S,
                            STATE_REFUSED_EXIT, STOP_GRACE_S, controller_log)
from meshrun.deploy.stopsignals import interrupts_while
from meshrun.deploy.errors import MeshrunError, interrupted_by
from meshrun.deploy.edges.fanout import on_each, start_each
from meshrun.deploy.edges.records import append_event
from meshrun.deploy.run.membership import (Change, MembershipEvent, Verdict, how_it_ended, judge, next_head, outlived,
                                           stop_detail, stops_after, world_size)
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.plan import HostLaunch, LaunchPlan, agent_verb_argv, at_generation
from meshrun.deploy.edges.agents import start_agent
from meshrun.deploy.edges.hoststop import Leftovers, stop_beside, stop_host
from meshrun.deploy.edges.hostlines import LineSink, read_host
from meshrun.deploy.edges.livehost import LiveHost as _Live
from meshrun.deploy.edges.transport import Session

# sshd granting a new SSH channel: one round trip on the agent's own connection, whose request waits
# in the controller's uplink queue and whose answer in the host's, which the run's all-reduce keeps
# full. Two saturated queues (up to ~2.5 s each) plus a 300 ms RTT, or one lost segment's resend,
# stay under 6 s; 3 s failed a healthy run while the controller uploaded anything (4.3 s).
PING_TIMEOUT_S = 6.0
PINGS_BEFORE_LOST = 2  # in a row; one probe at a time per host, the next on the tick after one ends
# Worst case from a cut (no reset) to lost, from the last probe that answered: each miss waits for a
# tick (HEARTBEAT_EVERY_S) and a full timeout: 2 x (2 + 6) = 16 s (12 s at best; was 5-10 s at 3 s).
LOST_WITHIN_S = PINGS_BEFORE_LOST * (HEARTBEAT_EVERY_S + PING_TIMEOUT_S)
TELL_TIMEOUT_S = 2.0  # a restart or peer-gone line a host has no room for this long: it does not read its stdin

NOT_CUT_SHORT = "Ctrl-C again does not cut this short"


RequestPoller = Callable[["JobRunner"], None]
Reconnect = Callable[[Host], Session]  # a fresh session to a host, or MeshrunError
MAX_REJOINS = 3  # per host: a host that keeps vanishing is left out after this many returns


class JobRunner:
    """Runs a plan: starts every host, streams, watches membership, stops everything when it must."""

    def __init__(self, plan: LaunchPlan, sessions: Mapping[str, Session], sink: LineSink, local_dir: Path,
                 local_python: str, poll_requests: RequestPoller | None = None,
                 notify: Callable[[MembershipEvent], None] | None = None, reconnect: Reconnect | None = None,
                 on_usage: LineSink | None = None) -> None:
        self.plan = plan
        self.sink = sink
        self.on_usage = on_usage  # (host, JSON) of each usage line its agent sends (deploy/host/idle.py)
        self.local_python = local_python
        self.local_dir = local_dir
        self.poll_requests = poll_requests
        self.notify = notify
        self.reconnect = reconnect
        self.rejoins: dict[str, int] = {}
        (local_dir / CONTROLLER_LOGS).mkdir(parents=True, exist_ok=True)
        self.hosts = [_Live(h, sessions[h.host.name], local_dir / controller_log(h.host.name)) for h in plan.hosts]
        self.head = next(h.host.name for h in plan.hosts if h.is_rendezvous_host)  # moves on succession
        # The succession order, the same list every agent walks (deploy/run/plan.py).
        self.order = tuple(g.head for g in next(iter(plan.hosts)).generations) if plan.hosts else ()
        self.events: list[MembershipEvent] = []
        self.finished_at: float | None = None  # when a host first finished with status 0 (monotonic)
        self.lock = threading.Lock()
        self.claims: set[str] = set()  # hosts being started (a join, a return) and not yet running: under lock
        self.stopping = threading.Event()
        self.interrupted: int | None = None  # the signal that stopped the run (SIGINT: any KeyboardInterrupt)
        # Hosts whose last agent's leftovers are being stopped (hoststop.Leftovers): no start there meanwhile,
        # but no place under the elastic maximum either: they are not joining.
        self.cleaning: set[str] = set()
        self.leftovers = Leftovers(plan.run_id, self._stop_host, PING_TIMEOUT_S, sink, self._cleaned)

    def run(self) -> JobOutcome:
        """Start, watch and conclude the job. A Ctrl-C (SIGTERM, SIGHUP: deploy/cli.py) at any moment of
        it makes the outcome STOPPED, whichever the hosts noticed first: the terminal signals the agents
        of a local run too, so their exit may reach us before our own KeyboardInterrupt does."""
        started = time.time()
        status, verdict, remaining = JobStatus.SUCCEEDED, Verdict(True), {}
        put_back = interrupts_while(self.stopping, self._on_interrupt)  # none raises once the stop began
        try:
            try:
                start_each(self.hosts, self._start_first)  # all at once: a slow sshd holds back none of the others
                threading.Thread(target=self._watch_links, daemon=True).start()
                verdict = self._wait()
                if verdict.failed:
                    status = JobStatus.FAILED
                    remaining = self.stop_all()
                self.leftovers.settle(self.events, self.lock)  # summary.json says what became of each such stop
            except KeyboardInterrupt:
                self.interrupted = self.interrupted or signal.SIGINT
                with contextlib.suppress(OSError):  # a terminal gone before its SIGHUP: the stop matters, not the line
                    self.sink("meshrun", f"meshrun: stopping every host (TERM, {STOP_GRACE_S:g} s grace, KILL) and "
                                         f"checking that each is clean; {NOT_CUT_SHORT}")
                remaining = self.stop_all()
                self.leftovers.settle(self.events, self.lock)  # stopping is set: no Ctrl-C raises in its wait
        finally:
            put_back()
        if self.interrupted:
            status, verdict = JobStatus.STOPPED, Verdict(True, reason=f"interrupted ({interrupted_by(self.interrupted)})")
        self.stopping.set()
        return JobOutcome(self.plan.run_id, status, started, time.time(), self._outcomes(remaining),
                          verdict.failed_host, verdict.reason, tuple(self.events), self.interrupted)

    def _on_interrupt(self, signum: int, raised: bool) -> None:
        self.interrupted = self.interrupted or signum
        if not raised:  # said beside: this thread may hold the console's lock where the signal found it
            threading.Thread(target=self.sink, daemon=True,
                             args=("meshrun", f"meshrun: still stopping every host; {NOT_CUT_SHORT}")).start()

    def generation(self) -> int:
        """The succession's current generation: the index of the current rendezvous host."""
        return self.order.index(self.head) if self.head in self.order else 0

    def claim(self, name: str) -> str | None:
        """Reserve `name` for a start (a `fab join`, a host that came back): None, or why not. A join
        prepares its host for seconds; without the reservation a return, or a second join, started
        the same host meanwhile (two agents restarting each other's workers), or both of two hosts
        passed the maximum."""
        bounds = self.plan.elastic
        with self.lock:
            if self.stopping.is_set():  # stop_all has run or runs: a start now would outlive "every host is clean"
                return f"run {self.plan.run_id} is ending; host '{name}' not started"
            running = [h.name for h in self.hosts if not h.done.is_set()]
            if name in self.claims or name in running:
                return f"host '{name}' is already in run {self.plan.run_id}, or being started"
            if name in self.cleaning:
                return f"host '{name}' is being stopped (what its last agent left); try again in a minute"
            if bounds is not None and len(running) + len(self.claims) >= bounds.max:
                return f"run {self.plan.run_id} already has its maximum of {bounds.max} hosts"
            self.claims.add(name)
            return None

    def unclaim(self, name: str) -> None:
        with self.lock:
            self.claims.discard(name)

    def _cleaned(self, name: str) -> None:
        with self.lock:
            self.cleaning.discard(name)

    def add_host(self, launch: HostLaunch, session: Session) -> None:
        """A host joining the running job (`fab join`), at the current generation (claimed first)."""
        live = _Live(at_generation(launch, self.generation()), session, self.local_dir / controller_log(launch.host.name))
        with self.lock:
            if self.stopping.is_set():
                raise MeshrunError(f"host '{live.name}': run {self.plan.run_id} is ending; nothing started")
            # Its lost entry must not be brought back or stopped later: this one runs.
            replaced = [old for old in self.hosts if old.name == live.name and old.done.is_set() and not old.replaced]
            for old in replaced:
                old.replaced = True
            self.hosts.append(live)
        try:
            self._start(live, Change.JOINED)
        except BaseException:  # never started: an entry left would count as running, and the job never end
            with self.lock:
                self.hosts.remove(live)
                for old in replaced:
                    old.replaced = False
            raise

    def remove_host(self, name: str) -> None:
        """A host leaving on purpose (`fab leave`): stop its part; the others go on if the bounds allow."""
        live = self._live(name)
        live.leaving = True
        self._stop_beside(live)

    def _start(self, live: _Live, change: Change) -> None:
        live.stream = start_agent(live.session, live.launch)
        threading.Thread(target=self._read, args=(live,), daemon=True, name=f"log-{live.name}").start()
        self._record(change, live.name)

    def _start_first(self, live: _Live) -> None:
        """Start a host of the launch. One whose start fails (its sshd never answers, its link
        dropped) is lost there and then: the run stops, or goes on without it, as for any lost
        host, and its log says why."""
        try:
            self._start(live, Change.STARTED)
        except MeshrunError as err:
            line = f"[{live.name}] meshrun: {err}"
            with contextlib.suppress(OSError), open(live.log, "a", encoding="utf-8") as log:  # a full disk: the console has it
                log.write(line + "\n")
            live.tail.append(line)
            self.sink(live.name, line)
            live.lost = live.seen_down = True
            live.done.set()

    def _record(self, change: Change, host: str, detail: str | None = None) -> MembershipEvent:
        with self.lock:
            size = world_size([h.view() for h in self.hosts])
            event = MembershipEvent(time.time(), change, host, size, detail)
            self.events.append(event)
        append_event(self.local_dir, {"time": round(event.time, 3), "event": change.value, "host": host,
                                      "world_size": size, "detail": detail})
        if self.notify is not None and change is not Change.STARTED:
            self.notify(event)
        return event

    def _read(self, live: _Live) -> None:
        read_host(live, self.sink, self.on_usage)  # sets live.done however the reading ends

    def _watch_links(self) -> None:
        """Heartbeats to every agent, and a liveness probe per host: a cut link sends no reset,
        so without a probe a lost host would look alive until TCP gives up, minutes later."""
        while not self.stopping.wait(HEARTBEAT_EVERY_S):
            for live in list(self.hosts):
                if live.done.is_set():
                    self._maybe_rejoin(live)
                if live.stream is None or live.done.is_set():
                    continue
                live.stream.send(b"\n", timeout=0)  # a full window already holds unread heartbeats
                if not live.probing:
                    live.probing = True
                    threading.Thread(target=self._probe, args=(live,), daemon=True).start()

    def _probe(self, live: _Live) -> None:
        try:
            alive = live.session.ping(timeout=PING_TIMEOUT_S)
        finally:
            live.probing = False
        if alive:
            live.missed_pings = 0
            return
        live.missed_pings += 1
        if live.missed_pings >= PINGS_BEFORE_LOST and not live.done.is_set():
            live.lost = live.cut = live.seen_down = True
            if live.stream is not None:
                live.stream.abandon()
            live.done.set()

    def _maybe_rejoin(self, live: _Live) -> None:
        """A host that was unreachable and answers again is started again, at the current
        generation, while the elastic run is below its maximum (it joins like `fab join`)."""
        bounds = self.plan.elastic
        if (bounds is None or self.reconnect is None or not live.lost or live.leaving or live.replaced
                or self.stopping.is_set() or self.finished_at is not None  # training is over: nothing to join
                or self.rejoins.get(live.name, 0) >= MAX_REJOINS or live.probing or live.rejoining):
            return
        if self.claim(live.name) is not None:  # at the maximum, or a join of it is under way
            return
        live.rejoining = True
        threading.Thread(target=self._try_rejoin, args=(live,), daemon=True).start()

    def _try_rejoin(self, live: _Live) -> None:
        """One attempt, never two at once: the stop of the old agent takes seconds, and a second
        attempt started meanwhile would start the host twice (two agents of one host in a
        rendezvous restart each other's workers for ever)."""
        try:
            self._rejoin(live)
        except MeshrunError:
            live.seen_down = True  # it did not answer after all: it stays lost, and may be tried again
        finally:
            live.rejoining = False
            self.unclaim(live.name)

    def _rejoin(self, live: _Live) -> None:
        assert self.reconnect is not None
        try:
            session = self.reconnect(live.launch.host)
        except MeshrunError:
            live.seen_down = True
            return
        if not live.seen_down or not session.ping(timeout=PING_TIMEOUT_S):
            session.close()
            return
        # A healed link can leave the old agent alive for up to its heartbeat timeout: stop it first.
        session.run(agent_verb_argv(live.launch.host, "stop", self.plan.run_id, self.local_python, STOP_GRACE_S),
                    timeout=STOP_GRACE_S + 25)
        generation = self.generation()
        fresh = _Live(at_generation(live.launch, generation), session, live.log)
        self.rejoins[live.name] = self.rejoins.get(live.name, 0) + 1
        fresh.stream = start_agent(fresh.session, fresh.launch)  # MeshrunError: `live` stays lost (a try spent)
        with self.lock:  # one step for any reader: a replaced entry always has its successor listed
            self.hosts.append(fresh)
            live.replaced = True
        threading.Thread(target=self._read, args=(fresh,), daemon=True, name=f"log-{fresh.name}").start()
        self._record(Change.JOINED, fresh.name, f"came back after being lost (generation {generation})")

    def _succeed(self, lost: _Live, hosts: list[_Live]) -> None:
        """The rendezvous host is gone: the agents move to the next host of the order by
        themselves (deploy/host/succession.py); record where the run goes on."""
        lost.was_head = True
        new = next_head(self.order, self.head, [h.view() for h in hosts]) if self.order else None
        if new is not None:
            self.head = new
            self._record(Change.SUCCESSION, new, f"rendezvous moved from {lost.name} to {new}")

    def _tell_survivors(self, gone: str, line: bytes) -> None:
        """`restart`: a cut host sends no reset, so the survivors' workers would wait in a collective
        for the whole process-group timeout; their agents restart them now, and torchrun
        re-rendezvouses without the cut host (a killed host needs none of this: its reset fails
        them at once). `peer-gone`, for every host that ended without finishing: an agent whose
        torchrun waits for it in torch's exit barrier ends that wait (deploy/host/exitbarrier.py)."""
        for live in list(self.hosts):
            if live.name != gone and live.stream is not None and not live.done.is_set():
                live.stream.send(line, timeout=TELL_TIMEOUT_S)

    def _wait(self) -> Verdict:
        """Until the job is finished or has failed; records each host's end as it happens."""
        while True:
            if self.poll_requests is not None:
                self.poll_requests(self)
            with self.lock:
                hosts = list(self.hosts)
            views = [h.view() for h in hosts]
            verdict = judge(views, self.plan.elastic)  # before the ends are recorded: whether stop_all follows
            for live, view in zip(hosts, views):
                if not view.running and not live.recorded:
                    self._ended(live, hosts, verdict.failed)
            if verdict.done:
                return verdict
            late = outlived(views, self.plan.elastic, self.finished_at, time.monotonic())
            for live in (h for h in hosts if h.name in late and not h.done.is_set()):
                live.outlived = True
                self._stop_beside(live)
            for live in hosts:
                if live.cut and not live.restarted_peers:
                    live.restarted_peers = True
                    if not live.was_head:  # the agents themselves move off a lost rendezvous host
                        self._tell_survivors(live.name, AGENT_RESTART_LINE)
            time.sleep(0.2)

    def _ended(self, live: _Live, hosts: list[_Live], failed: bool) -> None:
        """Records a host's end. A host of an elastic run whose agent ended by itself without finishing
        is stopped beside the loop (membership.stops_after), unless the run `failed`: stop_all stops
        every host then. Claimed meanwhile, so no `fab join` starts it for the stop to end; a join
        already under way starts it afresh, and the stop would end that agent: none then."""
        live.recorded = True
        # A host the probe lost has its stream dropped, which SSH may then end with rc -1: it is unreachable.
        rc = None if live.lost else live.rc
        change, detail = how_it_ended(rc, live.leaving, live.outlived, self.finished_at is not None)
        clean_up = not failed and self.plan.elastic is not None and stops_after(rc, live.leaving, live.outlived)
        with self.lock:
            clean_up = clean_up and live.name not in self.claims | self.cleaning and not live.replaced
            if clean_up:
                self.cleaning.add(live.name)
        event = self._record(change, live.name, stop_detail(detail, None, self.plan.run_id) if clean_up else detail)
        if clean_up:
            self.leftovers.start(live, event, detail)
        if change is Change.FINISHED and detail is None and self.finished_at is None and self.plan.elastic:
            self.finished_at = time.monotonic()  # training is over (membership.outlived)
        if change is not Change.FINISHED:
            self._tell_survivors(live.name, AGENT_PEER_GONE_LINE)
        # A refused rendezvous state fails the run: the agents do not move it on (deploy/host/agent.py).
        if change is not Change.FINISHED and live.name == self.head and live.rc != STATE_REFUSED_EXIT:
            self._succeed(live, hosts)

    def stop_all(self) -> dict[str, object]:
        """Stop the run on every host and confirm it. Returns {host: remaining pids or error}."""
        self.stopping.set()
        for live in self.hosts:
            if live.stream is not None:
                live.stream.close_stdin()  # the agent reads EOF as "controller gone" and stops too
        # One stop per host, over its newest entry's session: a host that came back or rejoined has
        # a newer entry after its old one, whose session may have died with the link that lost it.
        # The stop is by run id on the host, not by session: a second one there would do no more.
        newest = {live.name: live for live in self.hosts}
        while True:
            try:
                return on_each([live.launch.host for live in newest.values()],
                               lambda h: self._stop_host(newest[h.name]), timeout=STOP_GRACE_S + 30)
            except KeyboardInterrupt:  # only where no SIGINT handler of ours is installed
                self.interrupted = self.interrupted or signal.SIGINT
                continue  # a second Ctrl-C must not leave hosts half-stopped

    def _stop_beside(self, live: _Live) -> None:
        """Stop one host beside the watch loop (`fab leave`, or it outlived the training)."""
        stop_beside(live, self._stop_host, self.sink)

    def _stop_host(self, live: _Live) -> tuple[int, ...]:
        return stop_host(live, self.plan.run_id, self.local_python)

    def _live(self, name: str) -> _Live:
        """The host's current entry: a host that came back or rejoined has a newer one after the
        old, and a leave must stop the agent that runs, not the one that was lost."""
        return next(live for live in reversed(self.hosts) if live.name == name and not live.done.is_set())

    def _outcomes(self, remaining: Mapping[str, object]) -> tuple[HostOutcome, ...]:
        outcomes, deadline = [], time.monotonic() + 5  # one wait for all: hosts whose streams hang must not add up
        for live in self.hosts:
            live.done.wait(timeout=max(0.0, deadline - time.monotonic()))
            # stop_all's word, the newest on the host; else that of the stop of what this entry's agent left
            left = remaining[live.name] if live.name in remaining else self.leftovers.left(live)
            error = str(left) if isinstance(left, MeshrunError) else None
            pids = tuple(left) if isinstance(left, tuple) else ()
            outcomes.append(HostOutcome(live.name, live.rc, live.log, tuple(live.tail), pids, error,
                                        tuple(live.worker_tail)))
        return tuple(outcomes)
