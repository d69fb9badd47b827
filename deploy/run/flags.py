"""The tasks' flags that are not free text, read from what the user typed: one pure place, one-line errors.

invoke converts a flag whose default is a number by itself, and a bad value (`--timeout abc`) ends in its
traceback; `float()` would also take `inf`, `nan`, `1e400` and `٣`. So deploy/tasks.py declares every
such flag as text and reads it here: ASCII digits only, finite, more than 0 and bounded, or one line
naming the flag (exit status 2) before anything connects. An empty value is the default.
"""

from __future__ import annotations

import re

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown

SECONDS_RE = re.compile(r"[0-9]+(\.[0-9]+)?|\.[0-9]+")  # 10, 2.5, .5: no sign, exponent, inf or nan
WHOLE_RE = re.compile(r"[0-9]+")
DIGITS_MAX = 30  # past this many characters a number is a typo whichever it is: said as too large, not read
MAX_CONNECT_TIMEOUT_S = 600  # a host that takes longer to answer SSH is gone
MAX_PG_TIMEOUT_S = 86_400  # a collective that may stall a day has no timeout
MAX_LOG_LINES = 100_000  # per host: more is a file to fetch (fab fetch-checkpoints), not a screen
MAX_SYNC_TIMEOUT_S = 7 * 86_400  # `fab sync --timeout`: a first dataset over a home uplink may take days
MAX_PROGRAM = 1000  # characters of a host interpreter's path (--base, --reuse-site)


def connect_timeout(text: str, default: float) -> float:
    """`--timeout SECONDS` of check-network and trust: how long a dead host may cost."""
    if not text:
        return default
    if not SECONDS_RE.fullmatch(text):
        raise InputError(f"--timeout {shown(text)}: expected seconds, e.g. --timeout 10")
    value = float(text) if len(text) <= DIGITS_MAX else float("inf")
    if not 0 < value <= MAX_CONNECT_TIMEOUT_S:
        raise InputError(f"--timeout {shown(text)}: need 0 < SECONDS <= {MAX_CONNECT_TIMEOUT_S}")
    return value


def whole(flag: str, text: str, default: int, maximum: int, example: str) -> int:
    """A whole number from 1 to `maximum`, `default` when empty (`--lines`, train's `--timeout`)."""
    if not text:
        return default
    if not WHOLE_RE.fullmatch(text):
        raise InputError(f"{flag} {shown(text)}: expected a whole number, e.g. {flag} {example}")
    value = int(text) if len(text) <= DIGITS_MAX else maximum + 1
    if not 1 <= value <= maximum:
        raise InputError(f"{flag} {shown(text)}: need 1 <= {flag.lstrip('-').upper()} <= {maximum}")
    return value


def pg_timeout(text: str, default: int) -> int:
    """train's `--timeout`: the process-group timeout, whole seconds (the agent and trainer take an int)."""
    return whole("--timeout", text, default, MAX_PG_TIMEOUT_S, str(default))


def log_lines(text: str, default: int) -> int:
    return whole("--lines", text, default, MAX_LOG_LINES, str(default))


def host_program(flag: str, text: str) -> str:
    """A program on each host (`--base python3.11`, `--reuse-site /opt/conda/bin/python`): it is argv[0] or
    an argument there, so it is one printable word that no program would read as an option."""
    if not text or text.startswith("-") or len(text) > MAX_PROGRAM or not text.isprintable() or text != text.strip():
        raise InputError(f"{flag} {shown(text)}: expected an interpreter on the hosts, e.g. {flag} python3.11 or "
                         f"{flag} /opt/conda/bin/python")
    return text
