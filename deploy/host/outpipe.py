"""The agent's lines (its tee: `Supervisor.emit`): to the controller, sent by a thread of their own,
and to the host's train.log (`RunLog`). Standard library only.

Why: the agent's stdout is its SSH channel. When the link is cut, or the controller stops
reading, the channel's window fills (about 2 MiB) and a write blocks until TCP gives up, which
takes about 15 minutes with Linux's defaults. A blocking write in the watch loop (or in the tee
thread, which then holds the stream's lock) would hold the stop of the run as long: a host cut
off from its controller must stop its run within the heartbeat timeout (docs/elastic.md). So
lines go into a queue bounded in bytes that never blocks; a full queue drops lines, counted, and
says so once it has room again. The run's lines still reach the host's train.log, written before
this (the usage samples, which are not the run's log, are simply lost).

Neither half may raise: the tee thread must go on reading torchrun's pipe (a full one blocks
torchrun's `--tee` tails, and torchrun's end waits for them, so the run never ends on that host),
and the watch loop must go on watching. A train.log the disk refuses (full) is said once, to the
controller, and the run goes on.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable

QUEUE_BYTES = 4 << 20  # a run's output waiting for a slow link; a longer single line is dropped (train.log has it)
DRAIN_S = 5.0  # at the agent's end: how long its last lines may take to leave


class ControllerPipe:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.queued = self.dropped = 0  # bytes waiting, lines dropped: under `lock` (several threads put)
        self.lock = threading.Lock()
        self.open = True
        threading.Thread(target=self._pump, daemon=True).start()

    def put(self, data: bytes) -> None:
        """Never blocks: the line is queued, or dropped and counted."""
        if not self.open:
            return
        with self.lock:
            if self.queued + len(data) > QUEUE_BYTES:
                self.dropped += 1
                return
            if self.dropped:
                notice = (f"meshrun-agent: {self.dropped} lines not sent to the controller (its link was slow or "
                          "cut); the run's lines are in the host's train.log\n").encode()
                self.queued += len(notice)
                self.lines.put_nowait(notice)
                self.dropped = 0
            self.queued += len(data)
            self.lines.put_nowait(data)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait, at most `timeout` s, for the queued lines to be written."""
        deadline = time.monotonic() + timeout
        while self.open and self.lines.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _pump(self) -> None:
        while True:
            data = self.lines.get()
            try:
                self.stream.write(data)
                self.stream.flush()
            except OSError:  # BrokenPipeError included: the controller is gone
                self.open = False
                return
            finally:
                with self.lock:
                    self.queued -= len(data)
                self.lines.task_done()


class RunLog:
    """The host's train.log. A write the disk refuses is not raised but said once, by `say`; what of
    it fits the file's buffer (8 KiB) stays there, tried again with the next write, so the log goes
    on once the disk has room."""

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        self.path, self.say, self.said = path, say, False
        self.file = open(path, "ab")

    def write(self, data: bytes) -> None:
        try:
            self.file.write(data)
            self.file.flush()
        except OSError as err:
            if not self.said:
                self.said = True
                self.say(f"cannot write {self.path} ({err.strerror or err}): free space there; the run goes on, "
                         "its lines sent to the controller only")
