"""A listener on 127.0.0.1 for the link probe's tests: each connection served by a callable of
the test's (an honest far end, a liar, one that never reads)."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def listening(serve: Callable[[socket.socket], None], rcvbuf: int | None = None) -> Iterator[int]:
    """A listener thread on 127.0.0.1 serving every connection with `serve`; yields its port."""
    server = socket.socket()
    if rcvbuf:  # a small receive buffer: a throttled far end's drain stays short
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def accept() -> None:
        try:
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()
        except OSError:
            pass  # closed: the test is over

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
