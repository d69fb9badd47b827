"""Crash-safe file replacement, and the one bounded reader of files a person or a host wrote.

``torch.save`` and ``open(..., "w")`` are not atomic: a crash leaves a truncated file under the
final name. Here every write goes to a temp file in the same directory (same filesystem, so the
rename is atomic), is fsynced, renamed over the target with ``os.replace``, and then the
directory is fsynced so the rename itself survives a power loss.

``read_regular`` reads a file that someone else named (an inventory, a known_hosts, a run record, a
trainer config): a FIFO would block the reader forever and ``/dev/zero`` never ends, so only a regular
file is read, and at most one byte past its limit. ``open_regular`` is its open, for a reader that
reads otherwise (the end of a log).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator

TMP_PREFIX = ".tmp-"
# The names `_new_temp` gives: `.tmp-<target>.<pid>.<8 hex>`. A write killed outright (SIGKILL: its
# `finally` never runs) leaves one behind; the trainer removes its own (train/staletemps.py).
TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(.+)\.([0-9]+)\.[0-9a-f]{8}", re.ASCII | re.DOTALL)


class HashingWriter:
    """File-like object that forwards writes and keeps their sha256."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.inner.write(data)

    def flush(self) -> None:
        self.inner.flush()


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[HashingWriter]:
    """Yield a writer whose bytes appear at ``path`` all at once, or not at all."""
    tmp, fd = _new_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer = HashingWriter(handle)
            yield writer
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _new_temp(path: Path) -> tuple[Path, int]:
    """A new temp file beside ``path`` and its open descriptor, unique to this writer: two threads of one
    process saving the same file (the controller's join threads, the run record) must not share one. Not
    mkstemp: its 0o600 would make every written file private; O_EXCL with 0o666 gives what
    ``open(..., "wb")`` gave, the umask applied (0o644 under the usual 022)."""
    while True:
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:  # 1 in 4 billion: draw again
            continue


def atomic_write_bytes(path: Path, data: bytes) -> str:
    """Atomically replace ``path`` with ``data``; returns the sha256 hex digest."""
    with atomic_writer(path) as out:
        out.write(data)
    return out.sha.hexdigest()


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, sort_keys=True) + "\n").encode())


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def copy_hashed(src: Path, dst: Path) -> str:
    """Copy `src` to a new `dst` and return the sha256 of the bytes copied: one read for both."""
    sha = hashlib.sha256()
    with open(src, "rb") as source, open(dst, "xb") as out:
        for block in iter(lambda: source.read(1 << 20), b""):
            sha.update(block)
            out.write(block)
    return sha.hexdigest()


class FileRefused(OSError):
    """A file that is not read: not a regular file, or larger than the limit. `str()` says which, in words
    (`is a FIFO, not a regular file`); `too_large` tells the two apart."""

    def __init__(self, reason: str, too_large: bool = False) -> None:
        super().__init__(reason)
        self.too_large = too_large

    def __str__(self) -> str:
        return str(self.args[0])


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str | None:
    """`is a FIFO, not a regular file` (a directory, a device, ...) for a file mode that is not a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return f"is {kind}, not a regular file"


def size_text(limit: int) -> str:
    """`1 MiB`, `64 KiB` or `100 bytes`, for messages about a limit."""
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of `path` when it is a regular file; else FileRefused, nothing left open.
    Opened without blocking (a FIFO waits for a writer otherwise) and judged by fstat on that same open
    file, so a file swapped for a FIFO between a stat and the open is still refused. Any other OSError
    (FileNotFoundError, PermissionError, a name too long) is the caller's to word."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        problem = not_regular(os.fstat(fd).st_mode)
        if problem is not None:
            raise FileRefused(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path | str, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes; else FileRefused. It is
    opened by `open_regular`; at most `limit + 1` bytes are read, so a file that grows meanwhile is
    refused too. Any other OSError (FileNotFoundError, PermissionError, a name too long) is the caller's
    to word."""
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileRefused(f"is larger than {size_text(limit)}", too_large=True)
    return b"".join(chunks)
