"""A call made from a thread given a bound to come back: what the SSH tests (liveness, half-dead
sshd, name resolution) run, so a regression that waits out a long deadline fails instead of hanging."""

from __future__ import annotations

import threading
import time
from typing import Callable


def outcome(call: Callable[[], object], within: float) -> tuple[object, float]:
    """call()'s value or the exception it raised, and the seconds it took (at most `within`)."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box.append(err)

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"still waiting after {within} s"
    return box[0], time.monotonic() - began
