"""The idle rule, pure and standard library only: the controller applies it to an attached run's
hosts (deploy/edges/idle.py), and a detached run's agent to its own host (deploy/host/agent.py).

Utilisation is the mean GPU utilisation of the run's GPUs where the host reports one (`gpu_util`: the
GPUs nvidia-smi lists one of the run's processes on, deploy/host/usage.py; never an idle GPU beside
a run that trains on CPU), else the CPU time the busiest of the run's processes used per second
between two answers (all asleep: 0; one busy on a core: 1). On a CPU host shared with other work, a starved worker's share drops too. A
host is idle while its utilisation stays under the threshold; a spell ends at the first sample at
or above it. A spell is timed on a monotonic clock (the controller's as a sample arrives, a detached
agent's as it takes one), never a host's wall clock: a step of that (a VM's resume, chrony's
makestep) would warn and stop at once, or hold a stop back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

DEFAULT_THRESHOLD = 0.10  # of a GPU, or of a core per process
DEFAULT_WARN_MINUTES = 10.0


@dataclass(frozen=True)
class Usage:
    time: float  # as the host sent it, its wall clock; a detached agent judges its own on its monotonic clock
    cpu_s: float
    procs: int
    gpu_util: tuple[int, ...] | None  # of the GPUs the run's processes are on; None: judged by CPU
    per_pid: tuple[tuple[int, float], ...] = ()  # (pid, CPU seconds) of each run process
    checkpoint: int | None = None  # the newest step the host's checkpoint manifest lists


@dataclass(frozen=True)
class IdlePolicy:
    threshold: float = DEFAULT_THRESHOLD
    warn_s: float = DEFAULT_WARN_MINUTES * 60
    stop_s: float | None = None  # --idle-stop

    @property
    def sample_s(self) -> float:
        """How often to ask: a few samples per warning window, between 1 and 10 s."""
        return min(10.0, max(1.0, min(self.warn_s, self.stop_s or math.inf) / 6))


def utilisation(before: Usage, now: Usage) -> float | None:
    """0..1 (more for a process on several cores) between two answers; None when they cannot be
    compared (no time passed, nothing of the run running, its processes restarted)."""
    if now.gpu_util:
        return sum(now.gpu_util) / len(now.gpu_util) / 100
    elapsed = now.time - before.time
    if elapsed <= 0:
        return None
    earlier = dict(before.per_pid)
    shares = [(cpu - earlier[pid]) / elapsed for pid, cpu in now.per_pid if pid in earlier and cpu >= earlier[pid]]
    if now.per_pid or before.per_pid:
        return max(shares) if shares else None  # no process of the run lived through both answers
    used = now.cpu_s - before.cpu_s  # an answer without per_pid (an older host): the mean per process
    return None if now.procs == 0 or used < 0 else used / elapsed / now.procs


@dataclass
class IdleState:
    """One host's idle spell: since when on the judging clock (None: busy), and what was already said."""
    since: float | None = None
    warned: bool = False
    stopped: bool = False


def step(state: IdleState, policy: IdlePolicy, time: float, util: float | None) -> list[str]:
    """Feed one sample taken (or received) at `time`, a monotonic clock's seconds; returns the actions
    it triggers: 'warn' (once per spell), 'stop' (once)."""
    if util is None:
        return []
    if util >= policy.threshold:
        state.since, state.warned = None, False
        return []
    if state.since is None:
        state.since = time
    idle_for, actions = time - state.since, []
    if not state.warned and idle_for >= policy.warn_s:
        state.warned = True
        actions.append("warn")
    if policy.stop_s is not None and not state.stopped and idle_for >= policy.stop_s:
        state.stopped = True
        actions.append("stop")
    return actions


def warning(host: str, state: IdleState, policy: IdlePolicy, time: float, gpu: bool) -> str:
    what = "its GPUs" if gpu else "its run's processes"
    since = time - (state.since if state.since is not None else time)
    return (f"host '{host}' idle: {what} under {policy.threshold:.0%} utilisation for {since:.0f} s while "
            "the run is training" + ("" if policy.stop_s is None else f"; the run stops after {policy.stop_s:.0f} s"))


def policy_json(policy: IdlePolicy) -> str:
    """The policy as a detached run's agents get it on argv (`--idle`; nothing secret)."""
    return json.dumps({"threshold": policy.threshold, "warn_s": policy.warn_s, "stop_s": policy.stop_s},
                      separators=(",", ":"))


def parse_policy(text: str) -> IdlePolicy:
    """`policy_json`'s text back (the controller wrote it: a wrong shape raises)."""
    raw = json.loads(text)
    stop = raw["stop_s"]
    return IdlePolicy(float(raw["threshold"]), float(raw["warn_s"]), None if stop is None else float(stop))
