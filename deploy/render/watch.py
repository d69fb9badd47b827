"""`fab status --watch`'s view: a full-terminal table of the hosts, the run's line under it and
its last events, refreshed every 2 s (rich Live on its alternate screen) on a terminal; elsewhere,
or with `--frames N`, each frame printed in turn. Every cell is plain text through a
NeutralConsole (what a host says is shown, never obeyed)."""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Group
from rich.live import Live

from meshrun.deploy.render.neutral import NeutralConsole, PlainTable, plain
from meshrun.deploy.run.watchview import WatchRow, WatchView

PROGRESS = ("host", "state", "ranks", "gen", "epoch", "step", "samples/s", "progressed")
MACHINE = ("host", "rtt to rdzv", "busy", "mem GiB", "temp", "answered")
WIDE = 150  # columns from which one table holds it all; narrower terminals get two, one above the other
STYLES = {"running": "green", "not answering": "red bold", "lost": "red", "unreachable": "red", "stopped": "yellow"}


def _cells(r: WatchRow) -> dict[str, str]:
    return {"host": r.host, "state": r.state, "ranks": r.ranks, "gen": r.generation, "epoch": r.epoch, "step": r.step,
            "samples/s": r.samples_s, "progressed": r.progress, "rtt to rdzv": r.rtt, "busy": r.busy,
            "mem GiB": r.memory, "temp": r.temp, "answered": r.answered, "detail": r.detail}


def _table(columns: tuple[str, ...], rows: list[WatchRow], **kwargs: object) -> PlainTable:
    table = PlainTable(*columns, **kwargs)
    for r in rows:
        cells = _cells(r)
        table.add_row(*(cells[c] for c in columns), style=STYLES.get(r.state, ""))
    return table


def frame(title: str, shown: WatchView, width: int = WIDE) -> Group:
    """The hosts' table (two on a terminal narrower than WIDE) with the run's line under it, then
    the last events, oldest first. samples/s: now / average."""
    caption = {"caption": plain(shown.run), "caption_justify": "left"}
    if width >= WIDE:
        tables = [_table(PROGRESS + MACHINE[1:] + ("detail",), shown.rows, title=title, **caption)]
    else:
        tables = [_table(PROGRESS, shown.rows, title=title, **caption), _table(MACHINE + ("detail",), shown.rows)]
    events = PlainTable("at", "last events")
    for at, text in zip(shown.event_times, shown.events):
        events.add_row(time.strftime("%H:%M:%S", time.localtime(at)), text)
    if not shown.events:
        events.add_row("-", "none yet")
    return Group(*tables, events)


def watch(title: str, poll: Callable[[], WatchView], refresh_s: float, frames: int = 0) -> None:
    """Show `poll()` every `refresh_s` until Ctrl-C (KeyboardInterrupt, left to the caller), or
    `frames` times when frames > 0."""
    console = NeutralConsole(highlight=False)
    if frames > 0 or not console.is_terminal:
        poll()  # the first questions go out; each frame then shows what came back within refresh_s
        shown = 0
        while frames <= 0 or shown < frames:
            time.sleep(refresh_s)
            console.print(frame(f"{title} — {time.strftime('%H:%M:%S')}", poll(), console.width))
            shown += 1
        return
    with Live(frame(title, poll(), console.width), console=console, screen=True, auto_refresh=False) as live:
        while True:
            time.sleep(refresh_s)
            live.update(frame(f"{title} — {time.strftime('%H:%M:%S')}; Ctrl-C leaves the view, not the run", poll(),
                              console.width), refresh=True)
