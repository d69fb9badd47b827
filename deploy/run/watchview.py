"""`fab status --watch`'s rows, pure: what each host's agent and usage probe last said, how busy
the run is there (from two usage answers, `deploy/run/idle.utilisation`), and how long ago the host
last answered. A host silent for NOT_ANSWERING_S is shown as not answering, whatever it said last.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.deploy.errors import InputError
from meshrun.deploy.run.hoststate import HostState
from meshrun.deploy.run.idle import Usage, utilisation

NOT_ANSWERING_S = 10.0
REFRESH_S = 2.0


@dataclass(frozen=True)
class HostSeen:
    """The latest answers of one host, and when they came (controller clock)."""
    state: HostState | None = None
    usage: Usage | None = None
    before: Usage | None = None  # the usage answer before `usage`
    answered_at: float | None = None
    error: str | None = None  # why the last ask failed


@dataclass(frozen=True)
class WatchRow:
    host: str
    state: str
    generation: str
    epoch: str
    step: str
    busy: str
    answered: str
    detail: str


DETAIL_CLIP = 80


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_CLIP else text[:DETAIL_CLIP - 1] + "…"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def busy_text(before: Usage | None, now: Usage | None) -> str:
    """`GPU 87%` (mean of the run's GPUs), `CPU 95%` (per run process), or `-`."""
    if now is None:
        return "-"
    if now.gpu_util:
        return f"GPU {sum(now.gpu_util) / len(now.gpu_util):.0f}%"
    share = utilisation(before, now) if before is not None else None
    return "-" if share is None else f"CPU {share * 100:.0f}%"


def row(host: str, seen: HostSeen, now: float) -> WatchRow:
    silent = None if seen.answered_at is None else now - seen.answered_at
    state = seen.state
    if silent is None or silent >= NOT_ANSWERING_S:
        shown = "not answering" if seen.answered_at is not None or seen.error else "asking"
        return WatchRow(host, shown, "-", _cell(state and state.epoch), _cell(state and state.step), "-",
                        "never" if silent is None else f"{silent:.0f} s ago", _clip(seen.error or ""))
    return WatchRow(host, state.state if state else "unknown", _cell(state and state.generation),
                    _cell(state and state.epoch), _cell(state and state.step), busy_text(seen.before, seen.usage),
                    f"{silent:.0f} s ago", _clip((state.detail if state else None) or ""))


def rows(hosts: list[str], seen: dict[str, HostSeen], now: float) -> list[WatchRow]:
    return [row(h, seen.get(h, HostSeen()), now) for h in hosts]


def parse_frames(text: str) -> int:
    """`--frames N`: a whole number of frames, 1 to 10000 (0: not given)."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 10000):
        raise InputError(f"--frames {text[:40]!r}: expected a whole number of frames from 1 to 10000")
    return int(text)
