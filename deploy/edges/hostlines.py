"""A host's lines as its agent streams them, read by one thread per host (deploy/edges/launcher.py
starts it) to the end of the stream: into the host's log under the run's `logs/`, its tails, and
the console. Neither a log that cannot be written (a full disk) nor a console that cannot (stdout
redirected to a full file, a closed pipe) ends the reading, and the host's `done` is set however the
reading ends: a reader that died would leave its host running for ever in the launcher's eyes (the
liveness probe still answers), and the run would never conclude."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

from meshrun.layout import AGENT_USAGE_PREFIX
from meshrun.deploy.edges.livehost import LiveHost

LineSink = Callable[[str, str], None]  # (host, line without newline)
# Bytes of a host's log kept on the controller. Lines are cut at 64 KiB (capped.py), the total is cut
# here: a host that streams without end (a compromised one) must not fill the controller's disk, where
# summary.json, the journals and the next commands need room. Days of a chatty trainer fit many times.
LOG_MAX_BYTES = 4 << 30


def _size(count: int) -> str:
    return f"{count / 2**30:g} GiB" if count >= 2**30 else f"{count / 2**20:g} MiB"


class HostLog:
    """A host's log, appended a line at a time by unbuffered writes: a line that failed leaves nothing
    buffered to fail again, and the next lines are tried as they come, so the log goes on once the
    disk has room again, with a line saying how many are missing."""

    def __init__(self, path: Path, host: str, budget: int = LOG_MAX_BYTES) -> None:
        self.path, self.host, self.budget = path, host, budget
        self.fd: int | None = None
        self.size = 0  # of the file: what earlier readers of this host (a rejoin's) wrote counts too
        self.missed = 0  # lines not written since the last one that was
        self.cut = False  # the disk filled in the middle of a line: the file does not end with a newline

    @property
    def full(self) -> bool:
        """Past its budget: the line that passed it was followed by the one saying so, and no more."""
        return self.size >= self.budget

    def write(self, text: str) -> OSError | None:
        """Appends `text` as a line: None, or why it is not in the log (a full budget is no error:
        the line still reaches the console and the tail, and stays in the host's own train.log)."""
        try:
            self.open()
            if self.full:
                return None
            if self.missed:
                self._append(f"[{self.host}] meshrun: {self.missed} line(s) of this host are missing here: this file "
                             "could not be written")
                self.missed = 0
            self._append(text)
            if self.full:
                self._append(f"[{self.host}] meshrun: this file reached {_size(self.budget)}; further lines of this "
                             "host are not kept here (they stay in its own train.log: fab logs)")
        except OSError as err:
            self.missed += 1
            return err
        return None

    def open(self) -> None:
        """The file, there from the start (the run's summary names it) if it can be: else the first line
        written tries again and says why it cannot."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            self.size = os.fstat(self.fd).st_size

    def _append(self, text: str) -> None:
        assert self.fd is not None
        data = (b"\n" if self.cut else b"") + text.encode("utf-8", errors="replace") + b"\n"
        while data:  # a write the disk filled part of says how much it took; the next one raises
            written = os.write(self.fd, data)
            self.size += written
            data = data[written:]
            self.cut = bool(data)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):  # nothing is buffered: a close can lose nothing
                os.close(self.fd)
            self.fd = None


class HostLines:
    """What one host's reader does with each line; see the module docstring."""

    def __init__(self, live: LiveHost, sink: LineSink) -> None:
        self.live, self.sink = live, sink
        self.log = HostLog(live.log, live.name, LOG_MAX_BYTES)
        with contextlib.suppress(OSError):
            self.log.open()
        self.log_said = self.console_said = False

    def keep(self, text: str) -> None:
        """`text` into the host's log, its tail and the console."""
        err = self.log.write(text)
        if err is not None and not self.log_said:
            self.log_said = True
            self.show(f"[{self.live.name}] meshrun: cannot write {self.log.path} ({err.strerror or err}): free "
                      "space there; this host's lines go on to the console meanwhile, and to that file once it can "
                      "be written")
        self.live.tail.append(text)
        self.show(text)

    def show(self, text: str) -> None:
        try:
            self.sink(self.live.name, text)
        # rich answers a closed pipe with SystemExit (Console.on_broken_pipe, stdout then /dev/null), and a
        # console whose encoding cannot hold a host's character (a latin-1 locale, a tqdm bar) with
        # UnicodeEncodeError, a ValueError: in this thread either would end the reading, the host lost.
        except (OSError, ValueError, SystemExit) as err:
            if not self.console_said:
                self.console_said = True
                why = (err.strerror or str(err)) if isinstance(err, OSError) else \
                    "its pipe is closed" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
                self.log.write(f"[{self.live.name}] meshrun: the console cannot be written ({why}); this host's "
                               "lines go on to this file only")


def read_host(live: LiveHost, sink: LineSink, on_usage: LineSink | None) -> None:
    """Reads `live`'s stream to its end: each line to its log, tails and console (`sink`), a usage line
    to `on_usage`; then its agent's exit status. A reading that ends otherwise counts it lost."""
    name, lines, ended = live.name, HostLines(live, sink), False
    assert live.stream is not None
    try:
        while line := live.stream.readline():
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if text.startswith(AGENT_USAGE_PREFIX):  # for the idle rule, not the run's log
                if on_usage is not None:
                    with contextlib.suppress(OSError, ValueError, SystemExit):  # its warning's console: as above
                        on_usage(name, text[len(AGENT_USAGE_PREFIX):])
                continue
            if text.startswith(f"[{name}:"):
                live.worker_tail.append(text)
            else:
                text = f"[{name}] {text}"
            lines.keep(text)
        rc = live.stream.wait(timeout=5)
        live.rc, live.lost, ended = rc, live.lost or rc is None, True
    finally:
        live.lost = live.lost or not ended  # its stream read no more: as for a host whose link died
        lines.log.close()
        live.done.set()
