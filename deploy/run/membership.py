"""Who is in the job, and what a change means: pure rules for fixed and elastic runs.

A fixed run fails as soon as any host fails or is lost. An elastic run (`--nnodes MIN:MAX`)
survives losing any host, the rendezvous host included, while at least MIN hosts remain: torchrun
re-rendezvouses the survivors (under a new rendezvous on the next host of the succession order
when the rendezvous host was the one lost) and the trainer resumes from the newest checkpoint.

Split brain: a cut can leave two groups that each believe the other is dead. torchrun completes a
rendezvous only with at least MIN nodes, so two groups can both go on only if each has MIN hosts,
which is impossible when MIN is more than half of the hosts (`split_brain_risk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from meshrun.layout import AGENT_BUSY_EXIT, STATE_REFUSED_EXIT
from meshrun.deploy.inventory.model import ElasticBounds


class Change(str, Enum):
    STARTED = "started"
    JOINED = "joined"
    LEFT = "left"  # removed on purpose (`fab leave`)
    LOST = "lost"  # died, exited non-zero, or became unreachable
    SUCCESSION = "succession"  # the rendezvous moved to the next host of the order (`host`)
    FINISHED = "finished"  # exited 0


@dataclass(frozen=True)
class MembershipEvent:
    time: float
    event: Change
    host: str
    world_size: int  # processes on the hosts still in the job after this event
    detail: str | None = None


@dataclass(frozen=True)
class HostView:
    """What the controller knows about one host right now."""

    name: str
    nproc: int
    running: bool
    rc: int | None = None  # exit status once ended; None while running or when lost without one
    lost: bool = False
    leaving: bool = False


@dataclass(frozen=True)
class Verdict:
    done: bool
    failed: bool = False
    failed_host: str | None = None
    reason: str | None = None


OUTLIVED_DETAIL = "stopped: training had finished before it was admitted"
# An agent that ended with no exit status of its own: SSH's exit-signal is dropped by paramiko (rc -1),
# a local agent killed by a signal ends with -N. The OOM killer's SIGKILL, most often.
KILLED_DETAIL = "its agent ended without an exit status (killed?)"


def how_it_ended(rc: int | None, leaving: bool, outlived: bool,
                 training_done: bool = False) -> tuple[Change, str | None]:
    """A host's end for the timeline: the change, and why (None when it simply finished).
    `training_done`: a host of an elastic run finished with status 0 before (`outlived`): an exit
    status now costs no work and is no loss; an unreachable host is still lost (nobody knows what it
    is doing). A fixed run's judge fails on any non-zero status, so it never passes this."""
    if leaving:
        return Change.LEFT, None if rc == 0 else _end_detail(rc)
    if outlived:
        return Change.FINISHED, OUTLIVED_DETAIL
    if rc == 0:
        return Change.FINISHED, None
    if training_done and rc is not None:
        return Change.FINISHED, f"ended after training had finished ({_end_detail(rc)})"
    return Change.LOST, _end_detail(rc)


def _end_detail(rc: int | None) -> str:
    if rc is None:
        return "unreachable"
    if rc < 0:
        return KILLED_DETAIL
    if rc == STATE_REFUSED_EXIT:  # deploy/host/torchrun.py said which store, in the host's log
        return "it refused the rendezvous state: a member of the run may be compromised"
    if rc == AGENT_BUSY_EXIT:  # deploy/host/agent.py said whose, in the host's log
        return "another agent of this run already runs there; it started nothing"
    return f"exit status {rc}"


@dataclass(frozen=True)
class LeftStop:
    """How the stop of what a host's agent left went (deploy/edges/hoststop.py `Leftovers`)."""

    remaining: tuple[int, ...] = ()  # run pids still alive after it
    error: str | None = None  # why it did not run, or gave no report


def stops_after(rc: int | None, leaving: bool, outlived: bool) -> bool:
    """Whether a host of an elastic run that went on without it is stopped after it ended: its agent
    ended with no exit status of its own (killed: -1 over SSH, -N for a local agent), so it stopped
    nothing, and what its ranks started in sessions of their own still runs, tagged with the run, where
    only a stop by run id finds it (a fixed run's failure stops every host anyway). Not an agent that
    ended by itself with a status, however bad (it swept its run's processes as it ended: a refused
    rendezvous state, workers that failed, its own SIGTERM), nor a host that left or outlived the
    training (it was stopped), nor one lost unreachable (rc None: its agent lives and stops itself once
    the heartbeats stop, and a host that comes back is stopped before it starts again)."""
    return not leaving and not outlived and rc is not None and rc < 0


def stop_detail(detail: str | None, stop: LeftStop | None, run_id: str) -> str:
    """A host's end (`detail`) with what became of the stop after it: None while it runs."""
    ended = f"{detail}; " if detail else ""
    again = f"once the run has ended, run fab stop --run {run_id}"
    if stop is None:
        return f"{ended}stopping what it left"
    if stop.error is not None:
        return f"{ended}stopping what it left failed: {stop.error}; {again}"
    if stop.remaining:
        return (f"{ended}{len(stop.remaining)} process(es) of the run outlived the stop of what it left "
                f"({', '.join(map(str, stop.remaining))}); {again}")
    return f"{ended}stopped what it left"


def world_size(hosts: list[HostView]) -> int:
    return sum(h.nproc for h in hosts if h.running)


def _failed(h: HostView) -> bool:
    return not h.running and not h.leaving and (h.lost or h.rc != 0)


def judge(hosts: list[HostView], elastic: ElasticBounds | None) -> Verdict:
    """Whether the job goes on, is finished, or has failed, given every host's state."""
    broken = [h for h in hosts if _failed(h)]
    if elastic is None and broken:
        first = broken[0]
        what = "was lost" if first.lost else f"exited with status {first.rc}"
        return Verdict(True, True, first.name, f"host '{first.name}' {what}")
    running = [h for h in hosts if h.running]
    finished_ok = [h for h in hosts if not h.running and h.rc == 0]
    if elastic is not None and broken and not finished_ok and len(running) < elastic.min:
        names = ", ".join(h.name for h in broken)
        return Verdict(True, True, broken[0].name, f"lost {names}: {len(running)} host(s) left, below the elastic "
                                                   f"minimum of {elastic.min}")
    if running:
        return Verdict(False)
    return Verdict(True)


# How long hosts may still run after one finished with status 0 before they are stopped (`outlived`).
RUN_END_GRACE_S = 30.0


def outlived(hosts: list[HostView], elastic: ElasticBounds | None, finished_at: float | None,
             now: float) -> tuple[str, ...]:
    """The hosts of an elastic run still running RUN_END_GRACE_S after one host finished with status 0.

    torchrun ends an agent with status 0 once its exit barrier is through: every member of the last
    round had finished training. A host running long after that was (re)started too late to be
    admitted: it waits on a rendezvous its peers have closed, or on a store gone with them, until
    torch's join timeout (plus the succession's start-up grace) calls it a failure minutes later. It
    has no work to lose: it is stopped, and the run ends now, without a false loss."""
    if elastic is None or finished_at is None or now - finished_at < RUN_END_GRACE_S:
        return ()
    return tuple(h.name for h in hosts if h.running and not h.leaving)


def next_head(order: tuple[str, ...], current: str, hosts: list[HostView]) -> str | None:
    """The rendezvous host after `current` is lost: the next host of the launch's order that is
    still running (the agents pick the same one: they walk the same order)."""
    running = {h.name for h in hosts if h.running}
    later = order[order.index(current) + 1:] if current in order else order
    return next((name for name in later if name in running), None)


def split_brain_risk(bounds: ElasticBounds, host_count: int) -> str | None:
    """A warning when a cut could leave two groups that both reach MIN hosts and both go on."""
    if 2 * bounds.min > host_count:
        return None
    return (f"elastic minimum {bounds.min} of {host_count} hosts: a network split could leave two groups of "
            f"{bounds.min} that both carry on as separate jobs; use a minimum above half the hosts "
            f"({host_count // 2 + 1}) to rule that out")
