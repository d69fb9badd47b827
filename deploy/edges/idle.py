"""Idle detection for an attached run: each host's agent sends how busy the run is there every
few seconds (deploy/host/idle.py UsageFeed, on the stream that carries the run's output; the
launcher hands those lines here), this feeds them to the pure rule (`deploy/run/idle.py`), and
warns once per idle spell (a console line, a notification, the summary's `idle`); with
`--idle-stop` it asks the JobRunner to stop the run. The same lines carry the newest checkpoint
step each host lists: a newer one than any seen is passed on (`--every-checkpoint`). A line out of
shape is skipped, and a host that sends none is never judged: idleness is never judged from
silence (a lost host is the membership rules' business).

A spell is timed on this controller's monotonic clock, read as each line arrives, not on the time
the host's line carries: a host's wall clock that steps (a VM resumed, chrony's makestep) would
make two samples an hour apart at once, and warn and stop a run under `--idle-stop 30` on the
spot, or hold a stop back an hour. The host's time stays what is recorded and told (the summary's
`idle`, the notifications) and what a CPU share is measured over: a step there can make one
sample read idle (a spell the next busy sample ends) or unusable, no more."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run import idle as rules


class IdleStop(KeyboardInterrupt):
    """Raised in the JobRunner's loop (its request hook) to stop the run as a Ctrl-C would."""


class IdleWatcher:
    def __init__(self, policy: rules.IdlePolicy, hosts: tuple[Host, ...], warn: Callable[[str], None],
                 tell: Callable[[str, float, float, bool], None],
                 on_checkpoint: Callable[[str, float, int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.warn, self.tell, self.on_checkpoint = policy, warn, tell, on_checkpoint
        self.clock = clock  # what a spell is timed on (see above)
        self.newest_checkpoint = -1
        self.states = {h.name: rules.IdleState() for h in hosts}
        self.last: dict[str, rules.Usage] = {}
        self.warnings: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()  # every host's log reader feeds it

    def close(self) -> None:
        self.done.set()

    def check(self, _runner: object) -> None:
        """The JobRunner's request hook: stop the run once a host was idle past --idle-stop."""
        if self.stop_reason is not None and not self.done.is_set():
            self.done.set()
            raise IdleStop

    def feed(self, name: str, text: str) -> None:
        """One usage line of host `name`'s agent (the JSON after its prefix), read as any answer
        from a host is: shape-checked, and skipped when out of shape."""
        if name not in self.states:
            return
        at = self.clock()  # as it arrived: one host's lines come from its one reader thread, in order
        try:
            now = rules.read_usage(name, text)
        except MeshrunError:
            return
        with self._lock:
            if not self.done.is_set():
                self._judge(name, now, at)

    def _judge(self, name: str, now: rules.Usage, at: float) -> None:
        """`now`'s utilisation judged at `at` (this controller's clock); times recorded are the host's."""
        before, self.last[name] = self.last.get(name), now
        if now.checkpoint is not None and now.checkpoint > self.newest_checkpoint:
            self.newest_checkpoint = now.checkpoint
            if self.on_checkpoint is not None:
                self.on_checkpoint(name, now.time, now.checkpoint)
        util = rules.utilisation(before, now) if before is not None else None
        state = self.states[name]
        for action in rules.step(state, self.policy, at, util):
            idle_s = at - (state.since if state.since is not None else at)
            stopping = action == "stop"
            if action == "warn":
                self.warn(rules.warning(name, state, self.policy, at, bool(now.gpu_util)))
                self.warnings.append({"time": round(now.time, 3), "host": name, "idle_s": round(idle_s, 1),
                                      "threshold": self.policy.threshold})
            else:
                self.stop_reason = f"host '{name}' idle for {idle_s:.0f} s (--idle-stop)"
                self.warn(f"stopping the run: {self.stop_reason}")
            self.tell(name, now.time, idle_s, stopping)
