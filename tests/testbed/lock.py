"""One simulated cluster per machine at a time.

All clusters of a slot share its prefix and subnets (layout.py), and `up()`
first removes whatever a previous run left: a second pytest session (another
engineer, another CI job on the same box) would tear down the first one's
hosts mid-test. Sessions therefore hold the slot's exclusive flock while they use it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .layout import LOCK_PATH


class BusyError(RuntimeError):
    pass


@contextmanager
def exclusive(path: Path = LOCK_PATH, timeout: float = 900.0) -> Iterator[None]:
    """Hold the machine-wide test bed lock; wait at most `timeout` seconds
    (0: do not wait). The kernel drops it if the holder dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    raise BusyError(
                        f"the simulated cluster is in use (lock {path}, pid {holder or '?'})"
                    ) from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock
