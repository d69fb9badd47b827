"""When a torchrun whose workers are done waits for a peer that is gone.

At the end of a run each host's torchrun, its workers finished, waits in torch's exit barrier
until every other host's have ended: for up to 24 h in an attached run (common/layout.py
`ATTACHED_EXIT_BARRIER_S`; torch's own 300 s let a host exit 0 while a peer still worked). A host
lost right at the end (killed after this host's workers' last collective, or while they wrote
their last files) never arrives: without this module the survivors would sit there until that
timeout, and so would `fab train` (CI saw it with torch's 300 s: a run done at two hosts, the
other killed, `fab` still running after 300 s).

meshrun's torchrun creates a mark file as its barrier starts (deploy/host/torchrun.py
`mark_exit_barrier`); the controller tells every agent when a peer ends without finishing
(`peer-gone`, or `restart` for a cut one), and so does the peer watcher of a detached run. A peer
gone while this torchrun waits in the barrier, or gone while the worker group that went on to
succeed was running, ends the wait: the agent ends torchrun and reports its workers' success.
A peer gone before the current worker group started does not count: that loss was the
re-rendezvous that made this group (torchrun restarted its workers without the peer).

Standard library only (the agent's rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


class ExitBarrier:
    """One agent's view of its torchrun's exit barrier. `peer_gone` may be called from another
    thread (the controller's lines): it only replaces one attribute."""

    def __init__(self, mark: Path, workers: Callable[[], list[int]]) -> None:
        self.mark = mark
        self.workers = workers
        # The worker pids running when a peer was last reported gone; None: no report pending.
        self.pending: frozenset[int] | None = None

    def new_torchrun(self) -> None:
        """A torchrun is about to start: no mark of an earlier one, no pending report."""
        self.mark.unlink(missing_ok=True)
        self.pending = None

    def peer_gone(self) -> None:
        self.pending = frozenset(self.workers())

    def waiting(self) -> bool:
        """Whether this torchrun's workers succeeded and it waits for the other hosts (a stat)."""
        return self.mark.exists()

    def release(self) -> bool:
        """Whether to end torchrun now: it waits in its exit barrier and a peer of the group that
        succeeded is gone. Looks at the processes only while a report is pending."""
        pending = self.pending
        if pending is None:
            return False
        if self.waiting():
            return True
        running = set(self.workers())
        if running - pending:  # a worker group started after the report: the loss made it
            self.pending = None
        return False
