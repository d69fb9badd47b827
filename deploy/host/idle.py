"""A detached run's idle rule on its own host (common/idlerule.py, as the controller applies it to
an attached run): a thread samples how busy the run is here every few seconds and queues what the
rule says; the agent journals and prints it, sends it (this host's own event: its agent sends it,
whichever host holds the rendezvous), and on `stop` ends its part of the run. The policy comes from
the controller on argv (`--idle`, JSON: nothing secret)."""

from __future__ import annotations

import threading

from meshrun.deploy.host.usage import busy
from meshrun.idlerule import IdlePolicy, IdleState, Usage, step, utilisation, warning


def sample_of(found: dict) -> Usage:
    gpus = found["gpu_util"]
    return Usage(found["time"], found["cpu_s"], found["procs"], tuple(gpus) if gpus else None,
                 tuple(sorted((int(pid), cpu) for pid, cpu in found["per_pid"].items())))


class HostIdle:
    """Actions for the agent's loop: ("warn" | "stop", text for its journal, seconds idle)."""

    def __init__(self, policy: IdlePolicy, run_id: str, host: str) -> None:
        self.policy, self.run_id, self.host = policy, run_id, host
        self.state, self.last = IdleState(), None
        self._actions: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="meshrun-idle", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(self.policy.sample_s):
            now = sample_of(busy(self.run_id, self.host)[0])
            before, self.last = self.last, now
            util = utilisation(before, now) if before is not None else None
            for action in step(self.state, self.policy, now.time, util):
                idle_s = now.time - (self.state.since if self.state.since is not None else now.time)
                text = (warning(self.host, self.state, self.policy, now.time, bool(now.gpu_util)) if action == "warn"
                        else f"host '{self.host}' idle for {idle_s:.0f} s (--idle-stop)")
                with self._lock:
                    self._actions.append((action, text, idle_s))

    def take(self) -> list[tuple[str, str, float]]:
        with self._lock:
            actions, self._actions = self._actions, []
        return actions

    def stop(self) -> None:
        self._stop.set()
