"""The agent's lines (its tee: `Supervisor.emit`): to the controller, sent by a thread of their own,
and to the host's train.log (`RunLog`). Standard library and `common/` only.

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

train.log is reopened when its name no longer leads to the file held open (logrotate's default
`create` renames it and makes a new one; `fab logs` tails the name), as logging's
WatchedFileHandler does, but checked at most once per REOPEN_CHECK_S: the agent may write
thousands of lines a second. The lines written between the rename and the check go to the
renamed file (logrotate's `delaycompress` keeps them; `copytruncate` needs no reopen at all).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable

from meshrun.fsutil import FileRefused, not_regular

QUEUE_BYTES = 4 << 20  # a run's output waiting for a slow link; a longer single line is dropped (train.log has it)
DRAIN_S = 5.0  # at the agent's end: how long its last lines may take to leave
REOPEN_CHECK_S = 1.0  # how often train.log's name is compared with the file held open


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


def open_log(path: Path, follow: bool) -> BinaryIO:
    """train.log opened as `open(path, "ab")` opens it: its flags (O_CLOEXEC is Python's default), mode
    0o666 under the umask. Unless `follow`, a symlink at the path is refused (O_NOFOLLOW), and so is
    anything but a regular file, opened without blocking: a FIFO there would hold the tee for ever."""
    if follow:
        return open(path, "ab")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_NOCTTY, 0o666)
    try:
        if (problem := not_regular(os.fstat(fd).st_mode)) is not None:
            raise FileRefused(problem)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def names_other_file(path: Path, held: BinaryIO) -> bool:
    """Does `path` no longer lead to the open file `held` (renamed away, removed, replaced)? A name
    that cannot be looked at counts as gone: the reopen then says why."""
    try:
        named = os.stat(path)
    except OSError:
        return True
    kept = os.fstat(held.fileno())
    return (named.st_dev, named.st_ino) != (kept.st_dev, kept.st_ino)


class RunLog:
    """The host's train.log. A write the disk refuses is not raised but said once, by `say`; what of
    it fits the file's buffer (8 KiB) stays there, tried again with the next write, so the log goes
    on once the disk has room.

    A train.log renamed away (logrotate) is reopened by its name at the first write `check_s` after
    the last look (`clock` is monotonic). The first open follows a symlink at the path (a user's,
    set before the run: tests put /dev/full there), and so does a reopen where the path was a link
    at the start; where it was not, a reopen refuses a link (and anything but a regular file):
    logrotate makes a regular file, and a link that appears mid-run is someone else's. A file that
    cannot be reopened is said once; the lines go on into the file held, and the reopen is tried
    again at the next look."""

    def __init__(self, path: Path, say: Callable[[str], None], check_s: float = REOPEN_CHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.say, self.said, self.said_reopen = path, say, False, False
        self.check_s, self.clock = check_s, clock
        self.follow = path.is_symlink()
        self.file = open_log(path, follow=True)
        self.next_check = clock() + check_s
        self.lock = threading.Lock()  # the tee thread and the watch loop write; a reopen swaps the file

    def write(self, data: bytes) -> None:
        with self.lock:
            self._follow_rename()
            try:
                self.file.write(data)
                self.file.flush()
            except OSError as err:
                if not self.said:
                    self.said = True
                    self.say(f"cannot write {self.path} ({err.strerror or err}): free space there; the run goes on, "
                             "its lines sent to the controller only")

    def _follow_rename(self) -> None:
        if (now := self.clock()) < self.next_check:
            return
        self.next_check = now + self.check_s
        try:
            if not names_other_file(self.path, self.file):
                return
            fresh = open_log(self.path, self.follow)
        except OSError as err:
            if not self.said_reopen:
                self.said_reopen = True
                self.say(f"cannot reopen {self.path}, which no longer names the log's file ({err.strerror or err}); "
                         "the run's lines go on into that file, renamed or removed")
            return
        old, self.file = self.file, fresh
        try:
            old.close()  # flushes what a full disk left in its buffer, else drops it
        except OSError:
            pass
