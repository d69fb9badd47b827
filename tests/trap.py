"""A listening socket that stands for hosts: point an inventory's hosts at it, and any task that dials
one of them lands here instead (tests/test_run_liveness.py, tests/test_bad_input.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator


def listening_trap() -> Iterator[socket.socket]:
    """A fixture body: a non-blocking listener on 127.0.0.1, closed afterwards."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    yield listener
    listener.close()


def dialled(trap: socket.socket) -> int:
    """How many connections reached the trap since the last call (each is accepted and hung up)."""
    count = 0
    while True:
        try:
            conn, _ = trap.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1
