"""Stopping one host's part of a running job, for the launcher (deploy/edges/launcher.py): by run id,
over the host's own session, beside the watch loop, so the hosts that go on are never held up by a
stop that takes the agent's grace period, or a host that does not answer.

Two kinds: `stop_beside`, a host still running that must stop (`fab leave`, or it outlived the
training); and `Leftovers`, a host of an elastic run whose agent ended by itself without finishing.
Killed outright (the OOM killer's SIGKILL), that agent stopped nothing: the kernel ends its torchrun
and workers, but what a rank started in a session of its own is re-parented to init and runs on,
tagged with the run. A fixed run's failure stops every host; an elastic run goes on, so without this
stop nothing would ever be sent there."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from meshrun.layout import STOP_GRACE_S
from meshrun.deploy.edges.hostlines import LineSink
from meshrun.deploy.edges.livehost import LiveHost
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.answers import remaining_pids, said
from meshrun.deploy.run.membership import LeftStop, MembershipEvent, stop_detail
from meshrun.deploy.run.plan import agent_verb_argv

STOP_TIMEOUT_S = STOP_GRACE_S + 25  # the agent's TERM, grace and KILL, and an SSH channel on a busy link


def stop_host(live: LiveHost, run_id: str, local_python: str) -> tuple[int, ...]:
    """`agent stop` of the run on the host: the run pids still alive after it (MeshrunError: no report).
    Whether the run was running there is `fab stop`'s to say, not the launcher's: the pids only."""
    host = live.launch.host
    argv = agent_verb_argv(host, "stop", run_id, local_python, STOP_GRACE_S)
    result = live.session.run(argv, timeout=STOP_TIMEOUT_S)
    try:
        report = result.last_json()
    except (ValueError, IndexError):
        raise MeshrunError(f"host '{host.name}': stop gave no report (rc {result.rc}): "
                           f"{said(result.stderr.strip()[-200:])}") from None
    return remaining_pids(host.name, report).pids


def stop_beside(live: LiveHost, stop: Callable[[LiveHost], tuple[int, ...]], sink: LineSink) -> None:
    """Stop a running host in a thread of its own. A stop that fails drops the agent's connection: its
    agent reads EOF and stops the run by itself (heartbeats would have kept it going). Its log says
    why, and names what outlived a stop."""
    def run() -> None:
        try:
            left = stop(live)
        except MeshrunError as err:
            sink(live.name, f"[{live.name}] meshrun: stopping it failed: {err}; its agent's connection is "
                            "closed, so it stops the run itself")
            if live.stream is not None:
                live.stream.abandon()
            return
        if left:
            sink(live.name, f"[{live.name}] meshrun: {len(left)} process(es) of the run outlived the stop: "
                            f"{', '.join(map(str, left))}")
    threading.Thread(target=run, daemon=True, name=f"stop-{live.name}").start()


@dataclass
class Cleanup:
    """The stop of what one host's agent left: the host's entry, the timeline event of its end and the
    detail of that end without the stop's part, and how the stop went (None while it runs)."""

    live: LiveHost
    event: MembershipEvent
    ended: str | None
    done: threading.Event = field(default_factory=threading.Event)
    stop: LeftStop | None = None  # set by its thread
    settled: LeftStop | None = None  # what the run's outcome says: set by `settle`, at the run's end


class Leftovers:
    """The stops of what agents left (membership.stops_after) of one run, each in a thread of its own."""

    def __init__(self, run_id: str, stop: Callable[[LiveHost], tuple[int, ...]], ping_timeout: float,
                 sink: LineSink, release: Callable[[str], None]) -> None:
        self.run_id, self.stop, self.ping_timeout, self.sink = run_id, stop, ping_timeout, sink
        self.release = release  # ends the host's reservation (JobRunner.cleaning): no join starts it meanwhile
        self.cleanups: list[Cleanup] = []

    def start(self, live: LiveHost, event: MembershipEvent, ended: str | None) -> None:
        cleanup = Cleanup(live, event, ended)
        self.cleanups.append(cleanup)
        threading.Thread(target=self._run, args=(cleanup,), daemon=True, name=f"leftovers-{live.name}").start()

    def _run(self, cleanup: Cleanup) -> None:
        live = cleanup.live
        try:
            # A host whose link went with its agent: say so in seconds, not after the stop's timeout.
            if not live.session.ping(timeout=self.ping_timeout):
                cleanup.stop = LeftStop(error=f"host '{live.name}' does not answer")
            else:
                cleanup.stop = LeftStop(remaining=self.stop(live))
        except MeshrunError as err:
            cleanup.stop = LeftStop(error=str(err))
        finally:
            self.release(live.name)
            cleanup.done.set()
        self.sink(live.name, f"[{live.name}] meshrun: {stop_detail(cleanup.ended, cleanup.stop, self.run_id)}")

    def settle(self, events: list[MembershipEvent], lock: threading.Lock) -> None:
        """Waits for the stops still running (one deadline for all), then gives each host's end in
        `events` (the run's timeline) the stop's outcome: summary.json says what became of it. The
        journal (events.jsonl, for `fab status --watch`) keeps the end as it was said, "stopping what it
        left"; the host's line on the console says the outcome when it comes."""
        deadline = time.monotonic() + STOP_TIMEOUT_S + 2 * self.ping_timeout + 5
        for cleanup in self.cleanups:
            finished = cleanup.done.wait(max(0.0, deadline - time.monotonic()))
            cleanup.settled = cleanup.stop if finished else LeftStop(error="it had not finished when the run ended")
            detail = stop_detail(cleanup.ended, cleanup.settled, self.run_id)
            with lock:  # again after a Ctrl-C cut the first wait short: the event in the list is the one to replace
                at = next(i for i, e in enumerate(events) if e is cleanup.event)
                cleanup.event = events[at] = dataclasses.replace(cleanup.event, detail=detail)

    def left(self, live: LiveHost) -> tuple[int, ...] | MeshrunError:
        """For the host's outcome: what outlived the stop of what `live` left, or why it did not run."""
        stop = next((c.settled for c in self.cleanups if c.live is live), None)
        if stop is None:
            return ()
        return MeshrunError(stop_detail(None, stop, self.run_id)) if stop.error is not None else stop.remaining
