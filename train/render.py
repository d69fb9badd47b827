"""Console output for rank 0: a rich progress bar on a TTY, plain flushed lines otherwise.

This is the only trainer module that imports rich. Both classes share one small interface so
the trainer never branches on the output kind.
"""

from __future__ import annotations

import sys
from typing import Protocol, TextIO


class Console(Protocol):
    def line(self, text: str) -> None: ...
    def start_epoch(self, epoch: int, total_steps: int, done: int) -> None: ...
    def step(self, done: int, loss: float | None) -> None: ...
    def end_epoch(self) -> None: ...


class PlainConsole:
    """Log lines (torchrun prefixes them per rank); a step line every ``every`` steps."""

    def __init__(self, every: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.every, self.stream, self.enabled = max(every, 1), stream or sys.stdout, enabled
        self.epoch, self.total = 0, 0

    def line(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def start_epoch(self, epoch: int, total_steps: int, done: int) -> None:
        # `done` steps of a resumed epoch were trained before; `step` counts on from them.
        self.epoch, self.total = epoch, total_steps + done

    def step(self, done: int, loss: float | None) -> None:
        if loss is not None and (done % self.every == 0 or done == self.total):
            self.line(f"epoch {self.epoch + 1} step {done}/{self.total} loss {loss:.4f}")

    def end_epoch(self) -> None:
        pass


class RichConsole:
    """One live progress bar per epoch; lines print above it."""

    def __init__(self, every: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
            TimeRemainingColumn

        self.every = max(every, 1)
        self.progress = Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                                 TimeRemainingColumn())
        self.task: int | None = None

    def line(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def start_epoch(self, epoch: int, total_steps: int, done: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task("train", total=total_steps + done, completed=done,
                                           epoch=epoch + 1, loss="-")

    def step(self, done: int, loss: float | None) -> None:
        assert self.task is not None
        fields = {"loss": f"{loss:.4f}"} if loss is not None else {}
        self.progress.update(self.task, advance=1, **fields)

    def end_epoch(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.stop()


def make_console(is_main: bool, every: int, stream: TextIO | None = None) -> Console:
    """Rich bar on rank 0 at a terminal; plain lines on rank 0 otherwise; silence elsewhere."""
    out = stream or sys.stdout
    if is_main and out.isatty():
        return RichConsole(every)
    return PlainConsole(every, out, enabled=is_main)
