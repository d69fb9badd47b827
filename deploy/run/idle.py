"""Idle detection, pure: a host's utilisation from two usage answers (`deploy/host/usage.py`), and
the rule that turns a series of them into a WARN (once per idle spell) and, with `--idle-stop`,
a stop.

Utilisation is the mean GPU utilisation of the run's GPUs where the host reports one, else the CPU
time the busiest of the run's processes used per second between two answers (all asleep: 0; one
busy on a core: 1). On a CPU host shared with other work, a starved worker's share drops too. A host is idle while its utilisation stays under the threshold; a spell
ends at the first sample at or above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshrun.deploy.errors import InputError
from meshrun.deploy.run.answers import Answer, from_json, is_int, is_real

DEFAULT_THRESHOLD = 0.10  # of a GPU, or of a core per process
DEFAULT_WARN_MINUTES = 10.0
MAX_MINUTES = 7 * 24 * 60
GPU_LIMIT = 64  # GPUs read from one answer
PID_LIMIT = 256  # run processes read from one answer


@dataclass(frozen=True)
class Usage:
    time: float
    cpu_s: float
    procs: int
    gpu_util: tuple[int, ...] | None
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


def _plain_decimal(text: str, flag: str, expected: str) -> float | None:
    """Plain ASCII digits with an optional decimal part (no sign, exponent or unit); None when empty."""
    if not text:
        return None
    head, dot, tail = text.partition(".")
    if not (text.isascii() and head.isdigit() and (tail.isdigit() if dot else True) and len(text) <= 12):
        raise InputError(f"{flag} {text[:40]!r}: expected {expected}")
    return float(text)


def parse_minutes(text: str, flag: str) -> float | None:
    """`--idle-stop 30` / `--idle-warn 0.5`: minutes as plain ASCII decimals (None when not given)."""
    value = _plain_decimal(text, flag, "minutes, e.g. 30 or 0.5")
    if value is None:
        return None
    if not 0 < value <= MAX_MINUTES:
        raise InputError(f"{flag} {text}: expected more than 0 and at most {MAX_MINUTES} minutes")
    return value


def read_usage(host: str, text: str) -> Usage:
    """A usage answer, shape-checked field by field (a host's answer is data)."""
    raw = from_json(text.strip().splitlines()[-1] if text.strip() else "")
    reader = Answer(host, "the usage probe")
    answer = reader.mapping(raw)
    now, cpu = reader.number(answer.get("time"), "time"), reader.number(answer.get("cpu_s"), "cpu_s")
    procs, gpus = answer.get("procs"), answer.get("gpu_util")
    if now is None or cpu is None:
        raise reader.bad("time" if now is None else "cpu_s", None, "a number >= 0")
    if not (is_int(procs) and 0 <= procs < 2**20):
        raise reader.bad("procs", procs, "a count")
    if gpus is not None and not (isinstance(gpus, list) and all(is_int(g) and 0 <= g <= 100 for g in gpus)):
        raise reader.bad("gpu_util", gpus, "null or a list of percentages")
    per_pid = answer.get("per_pid", {})
    if not (isinstance(per_pid, dict) and len(per_pid) <= PID_LIMIT and all(
            k.isascii() and k.isdigit() and len(k) < 10 and is_real(v) and v >= 0 for k, v in per_pid.items())):
        raise reader.bad("per_pid", per_pid, f"an object of at most {PID_LIMIT} pid: CPU seconds")
    step = answer.get("checkpoint")
    if not (step is None or is_int(step) and 0 <= step < 10**9):
        raise reader.bad("checkpoint", step, "null or a step number")
    return Usage(float(now), float(cpu), procs, tuple(gpus[:GPU_LIMIT]) if gpus else None,
                 tuple(sorted((int(k), float(v)) for k, v in per_pid.items())), step)


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
    """One host's idle spell: since when (None: busy), and what was already said about it."""
    since: float | None = None
    warned: bool = False
    stopped: bool = False


def step(state: IdleState, policy: IdlePolicy, time: float, util: float | None) -> list[str]:
    """Feed one sample; returns the actions it triggers: 'warn' (once per spell), 'stop' (once)."""
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


def actions_over(series: list[tuple[float, float | None]], policy: IdlePolicy) -> list[tuple[float, str]]:
    """What a series of (time, utilisation) samples of one host triggers, in order."""
    state, found = IdleState(), []
    for time, util in series:
        found += [(time, action) for action in step(state, policy, time, util)]
    return found


def warning(host: str, state: IdleState, policy: IdlePolicy, time: float, gpu: bool) -> str:
    what = "its GPUs" if gpu else "its run's processes"
    since = time - (state.since if state.since is not None else time)
    return (f"host '{host}' idle: {what} under {policy.threshold:.0%} utilisation for {since:.0f} s while "
            "the run is training" + ("" if policy.stop_s is None else f"; the run stops after {policy.stop_s:.0f} s"))


def parse_percent(text: str, flag: str) -> float | None:
    """`--idle-below 25`: a whole or decimal percentage in (0, 100], as a fraction (None when not given)."""
    value = _plain_decimal(text, flag, "a percentage, e.g. 25 or 2.5")
    if value is None:
        return None
    if not 0 < value <= 100:
        raise InputError(f"{flag} {text}: expected more than 0 and at most 100 (percent)")
    return value / 100


def policy_from_flags(warn: str, stop: str, below: str = "") -> IdlePolicy:
    """`--idle-warn MINUTES --idle-stop MINUTES --idle-below PERCENT` (each may be left out);
    idle is under 10 % unless --idle-below says otherwise."""
    warn_min = parse_minutes(warn, "--idle-warn")
    stop_min = parse_minutes(stop, "--idle-stop")
    threshold = parse_percent(below, "--idle-below")
    return IdlePolicy(DEFAULT_THRESHOLD if threshold is None else threshold,
                      (DEFAULT_WARN_MINUTES if warn_min is None else warn_min) * 60,
                      None if stop_min is None else stop_min * 60)
