"""Crash-safe file replacement.

``torch.save`` and ``open(..., "w")`` are not atomic: a crash leaves a truncated file under the
final name. Here every write goes to a temp file in the same directory (same filesystem, so the
rename is atomic), is fsynced, renamed over the target with ``os.replace``, and then the
directory is fsynced so the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterator

TMP_PREFIX = ".tmp-"


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
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            writer = HashingWriter(handle)
            yield writer
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


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
