"""`fab status --watch`'s view: a full-terminal table refreshed every 2 s (rich Live on its alternate
screen) on a terminal; elsewhere, or with `--frames N`, each frame printed in turn. Every cell is
plain text through a NeutralConsole (what a host says is shown, never obeyed)."""

from __future__ import annotations

import time
from typing import Callable

from rich.live import Live

from meshrun.deploy.render.neutral import NeutralConsole, PlainTable
from meshrun.deploy.run.watchview import WatchRow

COLUMNS = ("host", "state", "generation", "epoch", "step", "busy", "answered", "detail")
STYLES = {"running": "green", "not answering": "red bold", "lost": "red", "unreachable": "red", "stopped": "yellow"}


def frame(title: str, rows: list[WatchRow]) -> PlainTable:
    table = PlainTable(*COLUMNS, title=title)
    for r in rows:
        table.add_row(r.host, r.state, r.generation, r.epoch, r.step, r.busy, r.answered, r.detail,
                      style=STYLES.get(r.state, ""))
    return table


def watch(title: str, poll: Callable[[], list[WatchRow]], refresh_s: float, frames: int = 0) -> None:
    """Show `poll()` every `refresh_s` until Ctrl-C (KeyboardInterrupt, left to the caller), or
    `frames` times when frames > 0."""
    console = NeutralConsole(highlight=False)
    if frames > 0 or not console.is_terminal:
        poll()  # the first questions go out; each frame then shows what came back within refresh_s
        shown = 0
        while frames <= 0 or shown < frames:
            time.sleep(refresh_s)
            console.print(frame(f"{title} — {time.strftime('%H:%M:%S')}", poll()))
            shown += 1
        return
    with Live(frame(title, poll()), console=console, screen=True, auto_refresh=False) as live:
        while True:
            time.sleep(refresh_s)
            live.update(frame(f"{title} — {time.strftime('%H:%M:%S')}; Ctrl-C leaves the view, not the run", poll()),
                        refresh=True)
