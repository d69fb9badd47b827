"""Who is in the job, and what a change means: pure rules for fixed and elastic runs.

A fixed run fails as soon as any host fails or is lost. An elastic run (`--nnodes MIN:MAX`)
survives losing hosts other than the rendezvous host while at least MIN hosts remain; torchrun
re-rendezvouses the survivors and the trainer resumes from the newest checkpoint. The
rendezvous host holds torchrun's c10d store, so losing it ends the job whatever the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from deploy.inventory.model import ElasticBounds


class Change(str, Enum):
    STARTED = "started"
    JOINED = "joined"
    LEFT = "left"  # removed on purpose (`fab leave`)
    LOST = "lost"  # died, exited non-zero, or became unreachable
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


def world_size(hosts: list[HostView]) -> int:
    return sum(h.nproc for h in hosts if h.running)


def _failed(h: HostView) -> bool:
    return not h.running and not h.leaving and (h.lost or h.rc != 0)


def judge(hosts: list[HostView], head: str, elastic: ElasticBounds | None) -> Verdict:
    """Whether the job goes on, is finished, or has failed, given every host's state."""
    broken = [h for h in hosts if _failed(h)]
    if elastic is None and broken:
        first = broken[0]
        what = "was lost" if first.lost else f"exited with status {first.rc}"
        return Verdict(True, True, first.name, f"host '{first.name}' {what}")
    for h in broken:
        if h.name == head:
            return Verdict(True, True, h.name, f"rendezvous host '{h.name}' was lost; torchrun's store lives there, so "
                                               "the job cannot survive it")
    running = [h for h in hosts if h.running]
    finished_ok = [h for h in hosts if not h.running and h.rc == 0]
    if elastic is not None and broken and not finished_ok and len(running) < elastic.min:
        names = ", ".join(h.name for h in broken)
        return Verdict(True, True, broken[0].name, f"lost {names}: {len(running)} host(s) left, below the elastic "
                                                   f"minimum of {elastic.min}")
    if running:
        return Verdict(False)
    return Verdict(True)
