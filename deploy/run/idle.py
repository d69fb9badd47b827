"""Idle detection, pure, on the controller: a host's usage answer (`deploy/host/usage.py`) read
field by field, the `--idle-*` flags, and a series of samples judged. The rule itself (utilisation,
the spell, the warning) is `common/idlerule.py`, which a detached run's agents apply too.
"""

from __future__ import annotations

from meshrun.deploy.errors import InputError
from meshrun.deploy.run.answers import Answer, from_json, is_int, is_real
from meshrun.idlerule import (DEFAULT_THRESHOLD, DEFAULT_WARN_MINUTES, IdlePolicy, IdleState, Usage,  # noqa: F401
                              step, utilisation, warning)

MAX_MINUTES = 7 * 24 * 60
GPU_LIMIT = 64  # GPUs read from one answer
PID_LIMIT = 256  # run processes read from one answer


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
