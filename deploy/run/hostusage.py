"""What `fab status --watch` reads from a host's usage answer (`deploy/host/usage.py`) beyond the
idle figures, and the run's events, pure: GPUs (utilisation, memory, temperature), the run's
resident memory, the link's round trip to the rendezvous store, the newest checkpoint, and the
lines of the agents' and the attached controller's events files.

Each field is shape-checked on its own; one of the wrong shape is dropped (its cell shows `-`),
never an exception, and never more than the bounds below. A host speaks only for itself: its
events are shown under its own name, whatever they say, and their text is escaped and clipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from meshrun.deploy.run.answers import from_json, is_int, is_real, said

GPU_LIMIT = 64
EVENTS_LIMIT = 20  # lines read from one answer or file
TEXT_CLIP = 120
AGENT_EVENTS = {"started": "started", "rejoined": "rejoined", "peers_lost": "saw peers lost",
                "peers_back": "saw peers back", "idle": "idle", "rendezvous_moved": "succession",
                "workers_restarted": "restarted its workers", "exit_barrier_left": "stopped waiting for a gone peer",
                "ended": "ended"}
CONTROLLER_EVENTS = {"started": "started", "joined": "joined", "left": "left", "lost": "lost",
                     "succession": "now hosts the rendezvous (succession)", "finished": "finished"}


@dataclass(frozen=True)
class Gpu:
    index: int
    util: int | None  # percent
    mem_used_mib: int | None
    mem_total_mib: int | None
    temp_c: int | None


@dataclass(frozen=True)
class Event:
    time: float
    host: str
    text: str


@dataclass(frozen=True)
class HostUsage:
    gpus: tuple[Gpu, ...] = ()
    rss: int | None = None  # bytes, the run's processes together
    rtt_ms: float | None = None
    rtt_missed: bool = False  # the store did not answer the connect in time
    checkpoint: int | None = None
    checkpoint_time: float | None = None
    events: tuple[Event, ...] = ()


def _small(value: object, limit: int) -> int | None:
    return value if is_int(value) and 0 <= value <= limit else None  # type: ignore[operator,return-value]


def _time(value: object) -> float | None:
    return float(value) if is_real(value) and 0 <= value < 1e11 else None  # type: ignore[arg-type,operator]


def parse_gpus(value: object) -> tuple[Gpu, ...]:
    """[[index, util, memory used, memory total, temperature], ...] (null for what nvidia-smi lacks)."""
    if not (isinstance(value, list) and all(isinstance(g, list) and len(g) == 5 for g in value)):
        return ()
    found = []
    for index, util, used, total, temp in value[:GPU_LIMIT]:
        if _small(index, 1023) is not None:
            found.append(Gpu(index, _small(util, 100), _small(used, 2**31), _small(total, 2**31), _small(temp, 200)))
    return tuple(found)


def agent_event(host: str, raw: object) -> Event | None:
    """One line of a host agent's events file: {time, event, text}, shown under `host`."""
    if not isinstance(raw, dict) or _time(raw.get("time")) is None or not _named(raw.get("event"), AGENT_EVENTS):
        return None
    text = raw.get("text")
    detail = f": {said(text, TEXT_CLIP)}" if isinstance(text, str) and text else ""
    return Event(_time(raw["time"]), host, f"{host} {AGENT_EVENTS[raw['event']]}{detail}")  # type: ignore[arg-type]


def _named(event: object, known: Mapping[str, str]) -> bool:
    """`event` is text naming one of `known`: a list or an object is no key (`in` would raise TypeError)."""
    return isinstance(event, str) and event in known


def controller_event(raw: object) -> Event | None:
    """One line of the attached controller's events file: {time, event, host, world_size, detail}."""
    if not isinstance(raw, dict) or _time(raw.get("time")) is None or not _named(raw.get("event"), CONTROLLER_EVENTS):
        return None
    host, size, detail = raw.get("host"), raw.get("world_size"), raw.get("detail")
    if not isinstance(host, str) or not host:
        return None
    name = said(host, 64)
    why = f" ({said(detail, TEXT_CLIP)})" if isinstance(detail, str) and detail else ""
    world = f"; world size {size}" if _small(size, 2**20) is not None else ""
    return Event(_time(raw["time"]), name, f"{name} {CONTROLLER_EVENTS[raw['event']]}{why}{world}")  # type: ignore[arg-type]


def controller_events(text: str) -> tuple[Event, ...]:
    """The last EVENTS_LIMIT sound lines of the controller's events file (a file others could edit)."""
    lines = text.splitlines()[-EVENTS_LIMIT:]
    return tuple(e for line in lines if (e := controller_event(from_json(line))) is not None)


def read_host_usage(host: str, text: str) -> HostUsage:
    """The watch's part of a usage answer (its last line); an answer that is no object gives nothing."""
    raw = from_json(text.strip().splitlines()[-1] if text.strip() else "")
    if not isinstance(raw, dict):
        return HostUsage()
    rtt = raw.get("rtt_ms")
    events = raw.get("events") if isinstance(raw.get("events"), list) else []
    return HostUsage(parse_gpus(raw.get("gpus")), _small(raw.get("rss"), 2**50),
                     float(rtt) if is_real(rtt) and 0 <= rtt < 1e6 else None, raw.get("rtt_missed") is True,
                     _small(raw.get("checkpoint"), 10**9 - 1), _time(raw.get("checkpoint_time")),
                     tuple(e for r in events[-EVENTS_LIMIT:] if (e := agent_event(host, r)) is not None))


def checkpoint_events(usages: dict[str, HostUsage]) -> list[Event]:
    """The newest checkpoint each host lists, once per step, with the hosts that hold it."""
    steps: dict[int, tuple[float, list[str]]] = {}
    for host, found in sorted(usages.items()):
        if found.checkpoint is not None and found.checkpoint_time is not None:
            at, holders = steps.get(found.checkpoint, (found.checkpoint_time, []))
            steps[found.checkpoint] = (min(at, found.checkpoint_time), holders + [host])
    return [Event(at, holders[0], f"checkpoint saved at step {step} ({', '.join(holders)})")
            for step, (at, holders) in steps.items()]


def last_events(controller: tuple[Event, ...], usages: dict[str, HostUsage], keep: int) -> list[Event]:
    """The newest `keep` events of the run, oldest first."""
    found = [*controller, *(e for u in usages.values() for e in u.events), *checkpoint_events(usages)]
    return sorted(found, key=lambda e: (e.time, e.host, e.text))[-keep:]
