"""A host's state while a job runs, owned by the launcher (deploy/edges/launcher.py): its launch, its
session and stream, how it ended, and the flags the launcher's threads read and set."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from meshrun.deploy.edges.transport import Session, Stream
from meshrun.deploy.run.membership import HostView
from meshrun.deploy.run.plan import HostLaunch

TAIL_LINES = 20  # of a host's output and of its workers', kept for the outcome


@dataclass
class LiveHost:
    """Mutable per-host state while the job runs; owned by JobRunner."""

    launch: HostLaunch
    session: Session
    log: Path
    stream: Stream | None = None
    rc: int | None = None
    lost: bool = False  # unreachable, or its connection died without an exit status
    leaving: bool = False  # being removed on purpose (`fab leave`)
    recorded: bool = False  # its end is in the timeline
    missed_pings: int = 0
    probing: bool = False  # a liveness probe is in flight
    cut: bool = False  # lost by the probe while its stream was still open: no TCP reset reached anyone
    restarted_peers: bool = False  # the survivors were told to restart after this host was cut
    was_head: bool = False  # it was the rendezvous host when it was lost
    seen_down: bool = False  # a probe found it unreachable (a killed run on a live host never is)
    replaced: bool = False  # it came back: a new _Live runs its part now
    rejoining: bool = False  # an attempt to start it again is in flight (at most one at a time)
    outlived: bool = False  # still waiting to be admitted when training finished: stopped, not lost
    done: threading.Event = field(default_factory=threading.Event)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    worker_tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def name(self) -> str:
        return self.launch.host.name

    def view(self) -> HostView:
        return HostView(self.name, self.launch.host.nproc_per_node, not self.done.is_set(), self.rc, self.lost,
                        self.leaving or self.outlived)
