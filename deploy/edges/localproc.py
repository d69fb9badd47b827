"""Processes the controller starts (rsync and its ssh, `address: local` commands), each with a
deadline from the moment it starts, its stdout and stderr read at the same time (a process
that fills one pipe while nobody reads it waits for ever), and never left running.

Each runs in a process group of its own: at its deadline the whole group gets SIGTERM, then
SIGKILL — rsync's ssh child too, which holds the stderr pipe and would outlive rsync. Groups
still running when this controller exits (Ctrl-C included: KeyboardInterrupt ends the program)
are killed on the way out. A controller killed outright (SIGKILL, the OOM killer; a closed
terminal's SIGHUP is a Ctrl-C since deploy/stopsignals.py) runs no exit handler: on Linux each child is also started with PR_SET_PDEATHSIG, so the
kernel sends it SIGTERM when the thread that started it goes (rsync then keeps its partial file
for the next fetch, and its ssh sees its pipes close); without that, a fetch's rsync would go on
writing into the staging tree under the next fetch.

`command_words` says what another process of this machine runs: from /proc on Linux, else (macOS)
from `ps`, run as above.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

TERM_GRACE_S = 2.0  # rsync removes its temp file on SIGTERM; then SIGKILL
DRAIN_WAIT_S = 5.0  # a child that left the group may hold a pipe open: stop reading after this
POLL_S = 0.05
PROC = Path("/proc")
PS_TIMEOUT_S = 5.0

Sink = Callable[[bytes], None]
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_live: set[int] = set()
_live_lock = threading.Lock()


def run_bounded(argv: Sequence[str], *, timeout: float, on_stdout: Sink, on_stderr: Sink, stdin: bytes | None = None,
                cwd: Path | None = None, sweep_group: bool = False) -> int | None:
    """Run `argv` to its end, at most `timeout` seconds; its output goes to the sinks as it comes.
    Returns the exit status, or None when it was killed at its deadline. `sweep_group`: once
    the process exits, kill what it left in its group (rsync's ssh). OSError when it cannot start."""
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_DIE_WITH_PARENT)
    with _live_lock:
        _live.add(proc.pid)
    try:
        pumps = [_thread(_drain, proc.stdout, on_stdout), _thread(_drain, proc.stderr, on_stderr)]
        if stdin is not None:
            pumps.append(_thread(_feed, proc.stdin, stdin))
        exited = _exited_by(proc, deadline)
        if not exited:
            _kill_group(proc.pid, signal.SIGTERM)
            _exited_by(proc, time.monotonic() + TERM_GRACE_S)
        if not exited or sweep_group:
            _kill_group(proc.pid, signal.SIGKILL)  # the leader is not reaped yet: its group id is still ours
        rc = proc.wait()
        drained = time.monotonic() + DRAIN_WAIT_S
        for pump in pumps:
            pump.join(max(0.0, drained - time.monotonic()))
        return rc if exited else None
    except BaseException:
        # Ctrl-C (KeyboardInterrupt) on this thread, mid-run: the exit handler is about to lose track
        # of the group (finally below), so it is ended here, as at the deadline.
        if proc.returncode is None:
            _kill_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(TERM_GRACE_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                pass
            _kill_group(proc.pid, signal.SIGKILL)
        raise
    finally:
        with _live_lock:
            _live.discard(proc.pid)


def command_words(pid: int, proc: Path = PROC) -> list[str] | None:
    """The command line of this machine's process `pid` as words: read from `proc` where it is a
    mounted /proc (it has `self`; one word per argument), else asked of `ps` (macOS has no /proc; split
    at whitespace). [] when there is no such process; None when one runs but nothing here says what
    (no `ps`, or one that fails or hangs): the caller decides what that means."""
    if (proc / "self").is_dir():
        try:
            return os.fsdecode((proc / str(pid) / "cmdline").read_bytes().removesuffix(b"\0")).split("\0")
        except OSError:
            return []
    if not process_exists(pid):
        return []  # no ps started for each long-gone pid a runs folder records
    out: list[bytes] = []
    try:  # -ww: the whole line, whatever the terminal's width (procps and BSD ps alike)
        rc = run_bounded(["ps", "-ww", "-o", "command=", "-p", str(pid)], timeout=PS_TIMEOUT_S,
                         on_stdout=out.append, on_stderr=lambda _: None)
    except OSError:
        return None
    words = os.fsdecode(b"".join(out)).split()
    return words if rc == 0 and words else None


def process_exists(pid: int) -> bool:
    """Whether this machine has a process `pid` (a zombie, or another user's, too)."""
    if pid <= 0:  # 0 and negatives name process groups to os.kill
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, and is another user's
        return True
    return True


def _parent_death_signal() -> Callable[[], None] | None:
    """The function a child runs before exec to get SIGTERM when its parent thread goes (Linux),
    resolved here, before any fork: the child only calls it (no lookup, no allocation)."""
    if not os.uname().sysname == "Linux":
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    option, sig, zero = ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGTERM), ctypes.c_ulong(0)
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(option, sig, zero, zero, zero)
        if os.getppid() != parent:  # it went between the fork and the prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return die_with_parent


_DIE_WITH_PARENT = _parent_death_signal()


def _thread(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _drain(pipe, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    with pipe:
        while data := pipe.read1(65536):
            sink(data)


def _feed(pipe, data: bytes) -> None:  # type: ignore[no-untyped-def]
    try:
        with pipe:
            pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # it exited or closed its stdin: what it said about that is on its stderr


def _exited_by(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether `proc` has exited by `deadline`, left unreaped (a zombie keeps its group id)."""
    if not hasattr(os, "waitid"):  # macOS before Python 3.13: reaped here, its group swept just after
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_leftovers() -> None:
    """At exit (Ctrl-C too): no group started here outlives this controller."""
    with _live_lock:
        groups = list(_live)
    for pgid in groups:
        _kill_group(pgid, signal.SIGTERM)
