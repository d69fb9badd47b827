"""A CPU hog to run beside timing-sensitive tests (Ctrl-C, recovery): busy processes, one per core
by default, so the test proves its bound on a loaded machine. Bounded: each hog exits by itself
after `limit_s` even if the test is killed, and is killed when the block ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

HOG = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def cpu_hog(processes: int | None = None, limit_s: float = 600.0) -> Iterator[list[int]]:
    """Yields the hogs' pids while they spin."""
    count = processes or os.cpu_count() or 2
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(limit_s)]) for _ in range(count)]
    try:
        yield [h.pid for h in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
