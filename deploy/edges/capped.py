"""Bounds on what a host can make the controller hold. A host decides how much it sends: one log
line of 400 MB with no newline, or a command that streams for the whole of its time limit. The
controller keeps at most LINE_MAX_BYTES of a line and ANSWER_MAX_BYTES of a command's output
(each of stdout and stderr), and says where it cut and how much: `[… N bytes cut]`.

A line keeps its start (where a log line says what it is); an answer keeps its first
ANSWER_HEAD_BYTES and its end (where the probes print their JSON), with the mark on a line of its
own between them. No I/O here: the readers are handed in.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable

LINE_MAX_BYTES = 64 << 10
ANSWER_MAX_BYTES = 4 << 20  # above every answer meshrun asks for (a checkpoint manifest is at most 1 MiB)
ANSWER_HEAD_BYTES = 64 << 10


def cut_mark(count: int) -> bytes:
    return f"[\u2026 {count} bytes cut]".encode()


def utf8_whole(data: bytes) -> int:
    """The length of `data` less a UTF-8 sequence cut short at its end (so a cut never makes
    half a character)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80 or byte >= 0xF8:  # ASCII, or no UTF-8 at all: nothing to keep whole
            return len(data)
        if byte >= 0xC0:  # the lead byte of the last sequence: is all of it here?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def read_line(readline: Callable[[int], bytes], limit: int = LINE_MAX_BYTES) -> bytes:
    """The next line from `readline(size)` (a file's readline with a size), b"" at the end. A line
    longer than `limit` keeps its first `limit` bytes and ends in ` [… N bytes cut]`; the rest of
    it is read and dropped, never held."""
    line = readline(limit)
    if len(line) < limit or line.endswith(b"\n"):
        return line
    cut, ending = 0, b""
    while more := readline(limit):
        if more.endswith(b"\n"):
            cut, ending = cut + len(more) - 1, b"\n"
            break
        cut += len(more)
    if not cut:
        return line + ending
    keep = utf8_whole(line)
    return line[:keep] + b" " + cut_mark(cut + len(line) - keep) + ending


class LineSplitter:
    """Cuts a byte stream into lines at any of `ends` (rsync ends its progress lines with \\r),
    each at most `limit` bytes and marked when cut; the part of a long line past `limit` is
    counted, never held."""

    def __init__(self, ends: bytes = b"\n", limit: int = LINE_MAX_BYTES) -> None:
        self.ends = re.compile(b"[" + re.escape(ends) + b"]")
        self.limit = limit
        self.pending = bytearray()
        self.cut = 0

    def feed(self, data: bytes) -> list[bytes]:
        lines, start = [], 0
        for match in self.ends.finditer(data):
            self._add(data[start:match.start()])
            lines.append(self._take())
            start = match.end()
        self._add(data[start:])
        return lines

    def flush(self) -> list[bytes]:
        """The last line, when the stream did not end with a line end."""
        return [self._take()] if self.pending or self.cut else []

    def _add(self, piece: bytes) -> None:
        room = self.limit - len(self.pending)
        self.pending += piece[:max(0, room)]
        self.cut += max(0, len(piece) - max(0, room))

    def _take(self) -> bytes:
        line = bytes(self.pending)
        if self.cut:
            keep = utf8_whole(line)
            line = line[:keep] + b" " + cut_mark(self.cut + len(line) - keep)
        self.pending.clear()
        self.cut = 0
        return line


class TailLines:
    """The last `count` lines of a byte stream (each cut at `limit`), for a message."""

    def __init__(self, count: int, limit: int = 1000) -> None:
        self.splitter = LineSplitter(b"\r\n", limit)
        self.lines: deque[bytes] = deque(maxlen=count)

    def feed(self, data: bytes) -> None:
        self.lines.extend(line for line in self.splitter.feed(data) if line.strip())

    def text(self) -> list[str]:
        """The kept lines, oldest first, decoded (undecodable bytes as U+FFFD)."""
        last = [line for line in self.splitter.flush() if line.strip()]
        self.lines.extend(last)
        return [line.decode("utf-8", errors="replace") for line in self.lines]


class Capped:
    """One output stream of a command, at most `limit` bytes of it held: its head and its tail,
    and between them a line that says how many bytes were cut."""

    def __init__(self, limit: int = ANSWER_MAX_BYTES, head: int = ANSWER_HEAD_BYTES) -> None:
        self.head_limit, self.tail_limit = head, limit - head
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail.append(data)
        self.tail_size += len(data)
        while self.tail_size - len(self.tail[0]) >= self.tail_limit:  # whole chunks first: no copying
            self.tail_size -= len(self.tail.popleft())

    def value(self) -> bytes:
        tail = list(self.tail)
        excess = max(0, self.tail_size - self.tail_limit)  # less than the first chunk (feed saw to it)
        if excess:
            tail[0] = tail[0][excess:]
        cut = self.total - len(self.head) - (self.tail_size - excess)
        mark = [b"\n" + cut_mark(cut) + b"\n"] if cut else []
        return b"".join([bytes(self.head), *mark, *tail])  # one copy of what is kept

    def text(self) -> str:
        return self.value().decode("utf-8", errors="replace")
