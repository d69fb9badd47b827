"""torchrun's `--tee` tail, whole lines only: each line a rank writes comes out once, with one
`[host:rank] ` prefix. Standard library only (it runs inside meshrun's torchrun, deploy/host/torchrun.py).

Why: torch's `tail_logfile` writes `header + fp.readline()`, and at the end of what a rank has
written so far `readline()` returns the line's start without its end. A tqdm bar is always such a
line (`"\\r" + bar`, no newline, until the next redraw), so every bar came out as
`[gpu1:0]  25%|##  | 25/100[gpu1:0] ` (the held-over end got a prefix of its own), after a blank
prefixed line for the bar's first carriage return. An ordinary `print` split in two writes
(`PYTHONUNBUFFERED`) could end the same way.

What changes: a line's start is held until its end arrives. A carriage return, a newline and
`\\r\\n` each end a line (docs/scripts.md "Progress bars": a redraw is a line of the logs), and
every line comes out ending in a newline. A carriage return that ends nothing (the one that starts
each redraw) makes no line. A line that stays unfinished (a prompt, a bar between slow redraws)
still comes out after `HOLD_S`, and at the end of the rank's output; the rest of it, once it comes,
is a line of its own, and its bare line end makes none.
"""

from __future__ import annotations

import codecs
import inspect
import locale
import os
import re
import time
from dataclasses import dataclass
from threading import Event
from typing import Any, Callable, TextIO

HOLD_S = 2.0  # how long an unfinished line waits for its end before it comes out as it is
MAX_HELD = 1 << 16  # characters: an unfinished line this long comes out at once (output with no line ends)
CHUNK = 1 << 16  # bytes read at a time
LINE_END = re.compile(r"(\r\n|\r|\n)")


@dataclass
class Lines:
    """Text read in pieces, split into whole lines (each ending in one "\\n"); see the module docstring."""

    held: str = ""  # the start of a line whose end has not come
    given_early: bool = False  # the last line out was given before its end: a bare line end closes it
    after_cr: bool = False  # the last piece ended in "\r": a "\n" first in the next is its "\r\n"

    def feed(self, text: str) -> list[str]:
        """The lines `text` finishes, in order."""
        if not text:
            return []
        if self.after_cr and text.startswith("\n"):
            text = text[1:]
        self.after_cr = text.endswith("\r")
        pieces = LINE_END.split(text)
        lines: list[str] = []
        for part, end in zip(pieces[0::2], pieces[1::2]):
            line, self.held = self.held + part, ""
            if line:
                lines.append(line + "\n")
            elif not self.given_early and end != "\r":  # an empty line the script printed
                lines.append("\n")
            self.given_early = False
        self.held += pieces[-1]
        if len(self.held) >= MAX_HELD:
            lines += self.flush()
        return lines

    def flush(self) -> list[str]:
        """The unfinished line as it is, given early (after HOLD_S, or at the end of the output)."""
        if not self.held:
            return []
        line, self.held, self.given_early = self.held + "\n", "", True
        return [line]


def tail_whole_lines(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                     log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's `tail_logfile` (same arguments; `TailLog.start` runs one per rank's file), writing
    whole lines only. Reads until `finished` is set and the file's end is reached, as torch's does."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    # The file's text as torch's tail reads it (the locale's encoding), decoded here so that a character
    # cut in two by a read is kept whole for the next one.
    decoder = codecs.getincrementaldecoder(locale.getpreferredencoding(False))(errors="replace")
    lines, held_since = Lines(), 0.0

    def write(out: list[str]) -> None:
        for line in out:
            if log_line_filter is None or log_line_filter(line):
                dst.write(f"{header}{line}")

    with open(file, "rb", buffering=0) as fp:
        while True:
            data = fp.read(CHUNK)
            if data:
                was_held = bool(lines.held)
                out = lines.feed(decoder.decode(data))
                write(out)
                if lines.held and (out or not was_held):  # a new unfinished line: its wait starts now
                    held_since = time.monotonic()
            elif finished.is_set():  # the rank's output is complete: what is left of it is a line
                write(lines.feed(decoder.decode(b"", final=True)) + lines.flush())
                return
            else:
                if lines.held and time.monotonic() - held_since >= HOLD_S:
                    write(lines.flush())
                time.sleep(interval_sec)


def install(tail_log: Any) -> bool:
    """Put `tail_whole_lines` in place of torch's `tail_log.tail_logfile`, which `TailLog.start` looks up
    when it starts each rank's tail. False: a torch whose tail takes other arguments, left as it is."""
    shipped = getattr(tail_log, "tail_logfile", None)
    if shipped is tail_whole_lines:
        return True
    if shipped is None or inspect.signature(shipped).parameters.keys() != \
            inspect.signature(tail_whole_lines).parameters.keys():
        return False
    tail_log.tail_logfile = tail_whole_lines
    return True
