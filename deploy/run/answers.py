"""A host's JSON answers, shape-checked, pure. A host is untrusted: whatever it prints is data. An
answer of the wrong shape (a list for an object, text for a port, a state nobody defined, a field
left out) is a one-line MeshrunError naming the host, what answered and what was wrong, never a
TypeError deep in the controller; the fan-out makes it that host's failure.

    host 'h1': the link probe gave an unexpected answer: [0].state is 'pwned'; expected one of open, …
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.shown import shown

MISSING: Any = object()  # a field the answer left out
SAID_CLIP = 240  # characters of a message a host wrote in its answer (its `error`)
PORTS = "a port number (1-65535)"


def escaped(text: str) -> str:
    """`text` with what does not print (newline, CR, ESC, a lone surrogate) written as Python writes it:
    `\\n`, `\\x1b`. Printable text, all an honest host sends in a field, comes back unchanged."""
    return text if text.isprintable() else repr(text)[1:-1]


def said(text: str, limit: int = SAID_CLIP) -> str:
    """A message written by a host, quoted in ours: control characters escaped, clipped."""
    text = escaped(text)
    return text if len(text) <= limit else text[:limit] + "…"


def network_hint(host: str) -> str:
    """What to run when a transfer to or from `host` fails (the end of rsyncrun's failure line)."""
    return f"check `fab check-network --hosts {host}`"


class Answer:
    """Reads one host's answer field by field; `host`: its name, `what`: what answered."""

    def __init__(self, host: str, what: str) -> None:
        self.host, self.what = host, what

    def error(self, why: str) -> MeshrunError:
        return MeshrunError(f"host '{self.host}': {self.what} gave an unexpected answer: {why}")

    def bad(self, field: str, value: object, expected: str) -> MeshrunError:
        return self.error(f"{field} is {'missing' if value is MISSING else shown(value)}; expected {expected}")

    def mapping(self, value: object, field: str = "the answer") -> dict:
        if not isinstance(value, dict):
            raise self.bad(field, value, "a JSON object" if field == "the answer" else "an object")
        return value

    def array(self, value: object, field: str = "the answer") -> list:
        if not isinstance(value, list):
            raise self.bad(field, value, "a list")
        return value

    def port(self, value: object, field: str) -> int:
        if not (is_int(value) and 1 <= value <= 65535):
            raise self.bad(field, value, PORTS)
        return value

    def text(self, value: object, field: str, optional: bool = False, limit: int | None = SAID_CLIP) -> str | None:
        """A text field. One clipped at SAID_CLIP or less is short (a version, a label, a name, a host's
        one-line message) and goes into a line of ours, so what does not print in it is escaped: a newline
        there would print a line that reads as meshrun's own about another host. Escaped, not refused:
        an honest host's text is printable and comes back as it was, while an honest message may hold a
        newline (an ImportError's) and is still said, as `said` says it. Longer or unclipped text (a
        command's output, split into lines by its caller; a message the caller quotes with `said`; a
        path `host_path` checks) comes back as sent."""
        if optional and value in (None, MISSING):
            return None
        if not isinstance(value, str):
            raise self.bad(field, value, "text or null" if optional else "text")
        if limit is None or limit > SAID_CLIP:
            return value if limit is None else value[:limit]
        return said(value[:limit], limit)

    def texts(self, value: object, field: str) -> tuple[str, ...]:
        """A list of short texts (actions done, notes, an argv run): each escaped as `text` escapes one."""
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise self.bad(field, value, "a list of text")
        return tuple(escaped(v) for v in value)

    def number(self, value: object, field: str) -> float | None:
        """A finite number >= 0, or None for null or a field left out."""
        if value in (None, MISSING):
            return None
        if not (is_real(value) and value >= 0):
            raise self.bad(field, value, "a number >= 0 or null")
        return value

    def flag(self, value: object, field: str) -> bool | None:
        if value is MISSING or value is None or isinstance(value, bool):
            return None if value is MISSING else value
        raise self.bad(field, value, "true, false or null")

    def choice(self, value: object, field: str, choices: Iterable[str]) -> str:
        allowed = tuple(choices)
        if value not in allowed or not isinstance(value, str):
            raise self.bad(field, value, f"one of {', '.join(allowed)}")
        return value


def from_json(text: str) -> Any:
    """The JSON value `text` holds, or MISSING when it holds none: not JSON, or `[[[[…` nested past
    Python's recursion limit (json.loads raises RecursionError there, not ValueError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return MISSING


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite number: a float that is neither NaN nor infinite, or a whole number a float can
    hold (JSON gives `10**400` as an int, which math.isfinite and float() refuse with OverflowError)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return is_int(value) and abs(value) < 2**1023  # type: ignore[operator]


@dataclass(frozen=True)
class StopAnswer:
    """An agent's `stop`: the process ids of the run it left alive (should be none), and whether the
    run was running there when it was asked (None: an agent that does not say). `fab stop` must tell
    a run it stopped from one that had ended; the launcher's stops keep the pids only."""

    pids: tuple[int, ...]
    was_running: bool | None


def remaining_pids(host: str, answer: object) -> StopAnswer:
    """What an agent's `stop` says (deploy/host/stopping.py prints it): the process ids still alive,
    and its `was_running`."""
    reader = Answer(host, "the agent's stop")
    found = reader.mapping(answer)
    remaining = found.get("remaining", MISSING)
    if not (isinstance(remaining, list) and all(is_int(p) and 0 < p < 2**31 for p in remaining)):
        raise reader.bad("remaining", remaining, "a list of process ids")
    return StopAnswer(tuple(remaining), reader.flag(found.get("was_running", MISSING), "was_running"))


class AgentBusy(MeshrunError):
    """A detached start refused: an agent of the run already runs on the host (deploy/host/agent.py)."""


def detached_record(host: str, answer: object) -> dict:
    """A detached agent's start: the run record it wrote, or its `error` (AgentBusy when it says `busy`)."""
    record = Answer(host, "the agent's detached start").mapping(answer)
    if "error" in record:
        error = record["error"]
        failure = AgentBusy if record.get("busy") is True else MeshrunError
        raise failure(f"host '{host}': detached start failed: {said(error) if isinstance(error, str) else shown(error)}")
    return record


def detached_failure(run_id: str, failed: Mapping[str, MeshrunError]) -> str:
    """Why a detached start failed, and what to do. A host that was busy runs an agent this start did
    not make (another controller's start of the same run, a race `--resume`'s check cannot see):
    `fab stop` would stop that run too, so the hint is then to look first, not to stop."""
    reasons = "; ".join(str(e) for e in failed.values())
    busy = [name for name, e in failed.items() if isinstance(e, AgentBusy)]
    if busy:
        return (f"{reasons}; run {run_id} already runs on {', '.join(busy)}: see it with fab status --run {run_id} "
                f"before you stop anything (fab stop --run {run_id} stops all of it)")
    return f"{reasons}; stop what did start with: fab stop --run {run_id}"
