"""`fab status --watch`'s view, pure: a row per host from what its agent and usage probe last
said, the run's line (world, epoch, samples/s, restarts, ETA) from the newest trainer progress
any host reported (`deploy/run/progress.py`), and the run's last events (`deploy/run/hostusage.py`).

A host silent for NOT_ANSWERING_S is shown as not answering, whatever it said last. The world
steps together: a host's samples/s is the world's times its share of the global batch, and its
last progress is the world's, shown on the hosts that have ranks in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrun.deploy.errors import InputError
from meshrun.deploy.run import progress as rate_of
from meshrun.deploy.run.hostusage import Event, HostUsage, last_events
from meshrun.deploy.run.hoststate import HostState
from meshrun.deploy.run.idle import Usage, utilisation
from meshrun.deploy.run.progress import Progress

NOT_ANSWERING_S = 10.0
REFRESH_S = 2.0
EVENTS_SHOWN = 8
DETAIL_CLIP = 80
GIB = 1 << 30


@dataclass(frozen=True)
class HostSeen:
    """The latest answers of one host, and when they came (controller clock)."""
    state: HostState | None = None
    usage: Usage | None = None
    before: Usage | None = None  # the usage answer before `usage`
    answered_at: float | None = None
    error: str | None = None  # why the last ask failed
    extra: HostUsage = field(default_factory=HostUsage)  # the watch's part of the usage answer
    progress_before: Progress | None = None  # the progress this host reported before state.progress


@dataclass(frozen=True)
class WatchRow:
    host: str
    state: str
    ranks: str
    generation: str
    epoch: str
    step: str
    samples_s: str  # now / average
    progress: str  # how long ago the world last progressed
    rtt: str  # to the rendezvous store
    busy: str
    memory: str  # GiB
    temp: str
    answered: str
    detail: str


@dataclass(frozen=True)
class WatchView:
    rows: list[WatchRow]
    run: str  # one line about the whole run
    events: list[str]  # the last events, oldest first
    event_times: list[float]  # when each happened (the clock of the host or controller that wrote it)


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_CLIP else text[:DETAIL_CLIP - 1] + "…"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def duration(seconds: float | None) -> str:
    """`42 s`, `3 min 05 s`, `2 h 07 min`."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def busy_text(before: Usage | None, now: Usage | None) -> str:
    """`GPU 87%` (mean of the run's GPUs), `CPU 95%` (per run process), or `-`."""
    if now is None:
        return "-"
    if now.gpu_util:
        return f"GPU {sum(now.gpu_util) / len(now.gpu_util):.0f}%"
    share = utilisation(before, now) if before is not None else None
    return "-" if share is None else f"CPU {share * 100:.0f}%"


def memory_text(extra: HostUsage) -> str:
    """The run's GPUs' memory used / total, else the resident memory of its processes; in GiB."""
    used = [g.mem_used_mib for g in extra.gpus if g.mem_used_mib is not None]
    total = [g.mem_total_mib for g in extra.gpus if g.mem_total_mib is not None]
    if used:
        return f"GPU {sum(used) / 1024:.1f}/{sum(total) / 1024:.0f}" if total else f"GPU {sum(used) / 1024:.1f}"
    return "-" if extra.rss is None else f"RSS {extra.rss / GIB:.1f}"


def temp_text(extra: HostUsage) -> str:
    temps = [g.temp_c for g in extra.gpus if g.temp_c is not None]
    return f"{max(temps)} °C" if temps else "-"


def rtt_text(extra: HostUsage) -> str:
    if extra.rtt_ms is not None:
        return f"{extra.rtt_ms:.1f} ms"
    return "no answer" if extra.rtt_missed else "-"


def newest_progress(seen: dict[str, HostSeen]) -> tuple[str, Progress, Progress | None] | None:
    """The newest trainer progress any host reported: (its host, it, the one that host reported before)."""
    found = [(s.state.progress.time, host, s.state.progress, s.progress_before)
             for host, s in sorted(seen.items()) if s.state is not None and s.state.progress is not None]
    if not found:
        return None
    _, host, now, before = max(found, key=lambda f: f[0])
    return host, now, before


def _rates(run: tuple[str, Progress, Progress | None], host: str) -> tuple[str, str]:
    """A host's samples/s `now / average`, and how long ago the world progressed (`-` off the world)."""
    _, now, before = run
    part = rate_of.share(now, host)
    if part == 0:
        return "-", "-"
    cells = [f"{r * part:.0f}" if r is not None and part is not None else "-"
             for r in (rate_of.rate(before, now), rate_of.average(now))]
    return " / ".join(cells), "-" if now.age_s is None else f"{duration(now.age_s)} ago"


def row(host: str, seen: HostSeen, now: float,
        run: tuple[str, Progress, Progress | None] | None = None) -> WatchRow:
    silent = None if seen.answered_at is None else now - seen.answered_at
    state = seen.state
    if silent is None or silent >= NOT_ANSWERING_S:
        shown = "not answering" if seen.answered_at is not None or seen.error else "asking"
        return WatchRow(host, shown, "-", "-", _cell(state and state.epoch), _cell(state and state.step), "-", "-",
                        "-", "-", "-", "-", "never" if silent is None else f"{silent:.0f} s ago",
                        _clip(seen.error or ""))
    ranks = rate_of.ranks(run[1], host) if run else None
    member = run is not None and ranks != 0
    epoch = run[1].epoch if member else state and state.epoch  # type: ignore[index]
    step = run[1].global_step if member else state and state.step  # type: ignore[index]
    samples, progressed = _rates(run, host) if run else ("-", "-")
    return WatchRow(host, state.state if state else "unknown", _cell(ranks), _cell(state and state.generation),
                    _cell(epoch), _cell(step), samples, progressed, rtt_text(seen.extra),
                    busy_text(seen.before, seen.usage), memory_text(seen.extra), temp_text(seen.extra),
                    f"{silent:.0f} s ago", _clip((state.detail if state else None) or ""))


def run_line(run: tuple[str, Progress, Progress | None] | None) -> str:
    """World, epoch and step, samples/s now and on average, restarts, ETA, and where it came from."""
    if run is None:
        return "no training progress reported yet"
    host, now, before = run
    epochs = f"/{now.epochs}" if now.epochs else ""
    hosts = f" on {len(now.host_batches)} host(s)" if now.host_batches else ""
    parts = [f"world {now.world_size} rank(s){hosts}", f"epoch {now.epoch}{epochs}",
             f"step {now.global_step} ({now.step_in_epoch}/{now.steps_per_epoch} of the epoch)"]
    speeds = [rate_of.rate(before, now), rate_of.average(now)]
    if any(s is not None for s in speeds):
        parts.append(f"{' / '.join('-' if s is None else f'{s:.0f}' for s in speeds)} samples/s (now / average)")
    if now.restarts is not None:
        parts.append(f"{now.restarts} restart(s)")
    eta = rate_of.eta_s(now)
    parts.append(f"ETA {duration(eta)}" if eta is not None else "ETA -")
    age = f", {duration(now.age_s)} old" if now.age_s is not None else ""
    return " · ".join(parts) + f" (progress from {host}{age})"


def view(hosts: list[str], seen: dict[str, HostSeen], now: float, controller: tuple[Event, ...] = ()) -> WatchView:
    """The whole frame: rows, the run's line and its last events (the controller's, the answering hosts')."""
    answering = {h: s for h, s in seen.items()
                 if s.answered_at is not None and now - s.answered_at < NOT_ANSWERING_S}
    run = newest_progress(answering)
    events = last_events(controller, {h: s.extra for h, s in seen.items()}, EVENTS_SHOWN)
    return WatchView([row(h, seen.get(h, HostSeen()), now, run) for h in hosts], run_line(run),
                     [e.text for e in events], [e.time for e in events])


def rows(hosts: list[str], seen: dict[str, HostSeen], now: float) -> list[WatchRow]:
    return view(hosts, seen, now).rows


def parse_frames(text: str) -> int:
    """`--frames N`: a whole number of frames, 1 to 10000 (0: not given)."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 10000):
        raise InputError(f"--frames {text[:40]!r}: expected a whole number of frames from 1 to 10000")
    return int(text)
