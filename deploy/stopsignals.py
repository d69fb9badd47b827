"""SIGTERM and SIGHUP taken as a Ctrl-C, for the error boundary (deploy/cli.guarded) and for the
launcher while a job runs (deploy/edges/launcher.py): their default action ended the controller
where it stood, and no cleanup ran (an attached run's hosts were not stopped and a `--firewall`
run's chain stayed up on every host). The exit statuses are deploy/errors.interrupted_status's."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from typing import Any, Callable

from meshrun.deploy.errors import Interrupted


class StopSignals:
    """SIGTERM and SIGHUP as a Ctrl-C while a command runs: the first raises `Interrupted` in the
    main thread, so every `finally` and `except KeyboardInterrupt` on the way runs as for a Ctrl-C
    (the launcher, whose handler calls this one, stops the run on every host instead). A later one
    is noted, no more: it must not cut that cleanup short, and whoever sends it can send SIGKILL.
    A signal this process was started ignoring (`nohup`) stays ignored."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.caught: int | None = None
        self.over = False  # the command has ended: a signal now is noted, not raised out of the boundary
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may install handlers; a thread's command is its caller's
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is signal.SIG_DFL:  # not SIG_IGN, and not an outer command's
                self.previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            off_the_terminal()
        if self.caught is None:
            self.caught = signum
            if not self.over:
                raise Interrupted(signum)

    def restore(self) -> None:
        self.over = True
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}


def interrupts_while(stopping: threading.Event, noted: Callable[[int, bool], None]) -> Callable[[], None]:
    """The launcher's handlers while a job runs (deploy/edges/launcher.py): SIGINT, and SIGTERM and
    SIGHUP where `StopSignals` made them interrupts, raise `Interrupted` until `stopping` is set, so
    that one during the stop cannot leave hosts half-stopped. Each runs the handler it replaces first,
    for what that does besides raising (SIGHUP's: output off the gone terminal), then is `noted`
    (the signal, and whether it raised). A SIGINT is caught even where ignored, as it always was:
    Ctrl-C stops a run. Returns what puts the handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {n: h for n in StopSignals.SIGNALS if callable(h := signal.getsignal(n))}
    previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)

    def on_signal(signum: int, frame: Any) -> None:
        with contextlib.suppress(KeyboardInterrupt):
            if callable(replaced := previous[signum]):
                replaced(signum, frame)
        raising = not stopping.is_set()
        noted(signum, raising)
        if raising:
            raise Interrupted(signum)

    def put_back() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    for signum in previous:
        signal.signal(signum, on_signal)
    return put_back


def off_the_terminal() -> None:
    """SIGHUP: the terminal is gone, and a write to it fails (EIO, or EPIPE where a pipe's reader
    went with it), which would end the cleanup half-way. Output to anything but a regular file goes
    to /dev/null from then on; a file keeps it (`fab train > run.log` in a tmux that was killed)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in (1, 2):
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                continue  # closed: nothing is written there anyway
    finally:
        os.close(null)
