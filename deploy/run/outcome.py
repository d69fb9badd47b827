"""What a launched job came to, per host and as a whole: plain records the launcher fills and
the summary and renderer read."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from meshrun.deploy.run.membership import MembershipEvent


class JobStatus(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class HostOutcome:
    host: str
    rc: int | None  # None: the connection was lost before an exit status came
    log: Path
    tail: tuple[str, ...]  # the last lines of everything the host printed
    remaining: tuple[int, ...] = ()  # run pids still alive after a stop (should be empty)
    stop_error: str | None = None
    worker_tail: tuple[str, ...] = ()  # the last lines its ranks printed (torchrun's own report excluded)


@dataclass(frozen=True)
class JobOutcome:
    run_id: str
    status: JobStatus
    started: float
    ended: float
    hosts: tuple[HostOutcome, ...]
    failed_host: str | None = None
    reason: str | None = None
    events: tuple[MembershipEvent, ...] = ()
    interrupted: int | None = None  # the signal (Ctrl-C's SIGINT, SIGTERM, SIGHUP) that stopped the run

    @property
    def duration_s(self) -> float:
        return self.ended - self.started

    def unreachable(self) -> frozenset[str]:
        """Hosts whose last run on this job ended without an exit status (lost, and not back): asking
        them anything after the run could wait on a link that is cut."""
        last = {h.host: h for h in self.hosts}  # in start order: a host that came back is listed again
        return frozenset(name for name, h in last.items() if h.rc is None)
