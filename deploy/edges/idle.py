"""Idle detection for an attached run: a thread asks each host how busy the run is there
(`deploy/host/usage.py`, every few seconds), feeds the pure rule (`deploy/run/idle.py`), and
warns once per idle spell (a console line, a notification, the summary's `idle`); with
`--idle-stop` it asks the JobRunner to stop the run. The same answers carry the newest checkpoint
step each host lists: a newer one than any seen is passed on (`--every-checkpoint`). A host that does not answer, or answers out
of shape, is skipped for that round: idleness is never judged from silence (a lost host is the
membership rules' business)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host import usage as usage_probe
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run import idle as rules
from meshrun.deploy.run.plan import python_of

PROBE_TIMEOUT_S = 10


class IdleStop(KeyboardInterrupt):
    """Raised in the JobRunner's loop (its request hook) to stop the run as a Ctrl-C would."""


class IdleWatcher:
    def __init__(self, policy: rules.IdlePolicy, hosts: tuple[Host, ...], sessions: Mapping[str, Session],
                 run_id: str, local_python: str, warn: Callable[[str], None],
                 tell: Callable[[str, float, float, bool], None],
                 on_checkpoint: Callable[[str, float, int], None] | None = None) -> None:
        self.policy, self.hosts, self.sessions, self.run_id = policy, hosts, sessions, run_id
        self.local_python, self.warn, self.tell, self.on_checkpoint = local_python, warn, tell, on_checkpoint
        self.newest_checkpoint = -1
        self.states = {h.name: rules.IdleState() for h in hosts}
        self.last: dict[str, rules.Usage] = {}
        self.warnings: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="meshrun-idle", daemon=True).start()

    def close(self) -> None:
        self.done.set()

    def check(self, _runner: object) -> None:
        """The JobRunner's request hook: stop the run once a host was idle past --idle-stop."""
        if self.stop_reason is not None and not self.done.is_set():
            self.done.set()
            raise IdleStop

    def _loop(self) -> None:
        while not self.done.wait(self.policy.sample_s):
            answers = on_each(self.hosts, self._ask, timeout=PROBE_TIMEOUT_S + 5).ok
            for host in self.hosts:
                if host.name in answers and not self.done.is_set():
                    self._judge(host.name, answers[host.name])

    def _ask(self, host: Host) -> rules.Usage:
        argv = [python_of(host, self.local_python), "-m", usage_probe.__name__, self.run_id, host.name]
        result = self.sessions[host.name].run(argv, timeout=PROBE_TIMEOUT_S)
        if not result.ok:
            raise MeshrunError(f"host '{host.name}': the usage probe failed")
        return rules.read_usage(host.name, result.stdout)

    def _judge(self, name: str, now: rules.Usage) -> None:
        before, self.last[name] = self.last.get(name), now
        if now.checkpoint is not None and now.checkpoint > self.newest_checkpoint:
            self.newest_checkpoint = now.checkpoint
            if self.on_checkpoint is not None:
                self.on_checkpoint(name, now.time, now.checkpoint)
        util = rules.utilisation(before, now) if before is not None else None
        state = self.states[name]
        for action in rules.step(state, self.policy, now.time, util):
            idle_s = now.time - (state.since or now.time)
            stopping = action == "stop"
            if action == "warn":
                self.warn(rules.warning(name, state, self.policy, now.time, bool(now.gpu_util)))
                self.warnings.append({"time": round(now.time, 3), "host": name, "idle_s": round(idle_s, 1),
                                      "threshold": self.policy.threshold})
            else:
                self.stop_reason = f"host '{name}' idle for {idle_s:.0f} s (--idle-stop)"
                self.warn(f"stopping the run: {self.stop_reason}")
            self.tell(name, now.time, idle_s, stopping)
