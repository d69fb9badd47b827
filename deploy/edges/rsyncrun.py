"""Running rsync for the code sync, the data sync, fetches and pushes: within a deadline, its
stdout read line by line while its stderr is read at the same time (about 3000 unreadable files
write more than a pipe holds), the last lines of stderr kept for the message, and rsync and its
ssh never left running (deploy/edges/localproc.py).

Every rsync argv carries `io_timeout_option()`: rsync's own I/O timeout, so a host that accepts
the connection and then sends nothing (its sshd never starts the command, or its rsync is stuck)
ends the transfer after RSYNC_IO_TIMEOUT_S, however long the whole transfer may take. rsync
sends keep-alives while it works, so an honest host that is busy never meets it.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import time
from typing import Callable, Sequence

from meshrun.deploy.edges.capped import LineSplitter, TailLines
from meshrun.deploy.edges.jumps import REFUSED_TRIES, refused_pause
from meshrun.deploy.edges.localproc import run_bounded
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.answers import said

RSYNC_IO_TIMEOUT_S = 60
RSYNC_TIMEOUT_EXIT = 30  # rsync's exit status for "timeout in data send/receive"
RSYNC_VANISHED_EXIT = 24  # "some files vanished before they could be transferred"
ERR_LINES = 20  # of rsync's stderr, kept for the message
MESSAGE_CHARS = 1000  # of those lines in the message: the newest that fit
# OpenSSH's words for a connection closed or reset before the banner ("ssh_" before 8.0). ssh's own
# ConnectionAttempts would not help: it tries the TCP connect again, which sshd had accepted.
REFUSED_RE = re.compile(r"\b(?:kex|ssh)_exchange_identification: (?:read: )?Connection (?:closed|reset)")
RSYNC_MIN = (3, 2, 3)  # --mkpath, which every sync passes; macOS ships 2.6.9 (or openrsync), Ubuntu 20.04 3.1.3
VERSION_RE = re.compile(rb"rsync\s+version\s+v?(\d+)\.(\d+)\.(\d+)")


def io_timeout_option() -> str:
    return f"--timeout={RSYNC_IO_TIMEOUT_S}"


def run_rsync(argv: Sequence[str], *, host: str, what: str, timeout: float, hint: str, stdin: bytes | None = None,
              on_line: Callable[[bytes], None] | None = None, success: tuple[int, ...] = (0,)) -> None:
    """Run rsync to its end within `timeout` s, each line of its stdout (split at \\n and \\r) to
    `on_line`; an exit status in `success` is success. A failure is one MeshrunError:
    `host '<host>': <what> failed (rsync exit N): <the last lines of its stderr>; <hint>`.
    A try whose ssh was turned away before the SSH banner is run again (`refused_at_handshake`)."""
    local_rsync_problem(argv[0], host, what)
    deadline = time.monotonic() + timeout
    for attempt in range(1, REFUSED_TRIES + 1):
        rc, errors = _run_once(argv, host, what, deadline - time.monotonic(), stdin, on_line)
        if rc in success or attempt == REFUSED_TRIES or not refused_at_handshake(rc, errors):
            break
        pause = refused_pause(attempt)  # random: the hosts turned away together do not come back together
        if time.monotonic() + pause >= deadline:
            break
        time.sleep(pause)
    if rc in success:
        return
    said_last = stderr_tail(errors)
    if rc is None:
        raise MeshrunError(f"host '{host}': {what} did not finish within {timeout:.0f} s; rsync was stopped "
                           f"({said_last}); {hint}")
    why = f"rsync exit {rc}" + (f": no data from the host for {RSYNC_IO_TIMEOUT_S} s" if rc == RSYNC_TIMEOUT_EXIT else "")
    if "--mkpath" in said_last:  # the far end's rsync does not know it: older than RSYNC_MIN
        hint = f"the host's rsync is older than {'.'.join(map(str, RSYNC_MIN))}: install a newer one there"
    raise MeshrunError(f"host '{host}': {what} failed ({why}): {said_last}; {hint}")


def refused_at_handshake(rc: int | None, stderr: Sequence[str]) -> bool:
    """rsync's ssh (or the ssh of its ProxyCommand, to a jump host) was closed or reset before the
    SSH banner: how sshd turns a connection away past MaxStartups. Nothing logged in, so nothing was
    sent: trying again is safe. rsync says 255 (its ssh's status) or 12 (the pipe closed first)."""
    return rc in (12, 255) and any(REFUSED_RE.search(line) for line in stderr)


def _run_once(argv: Sequence[str], host: str, what: str, timeout: float, stdin: bytes | None,
              on_line: Callable[[bytes], None] | None) -> tuple[int | None, list[str]]:
    """One run of rsync: its exit status (None: stopped at `timeout`) and its last stderr lines."""
    lines, errors = LineSplitter(b"\r\n"), TailLines(ERR_LINES)

    def out(data: bytes) -> None:
        for line in lines.feed(data):
            if on_line is not None:
                on_line(line)

    try:
        rc = run_bounded(argv, timeout=max(timeout, 0.0), on_stdout=out, on_stderr=errors.feed, stdin=stdin,
                         sweep_group=True)
    except OSError as err:
        raise MeshrunError(f"host '{host}': {what}: {cannot_start(argv[0], err, _open_files_limit())}") from None
    for line in lines.flush():
        if on_line is not None:
            on_line(line)
    return rc, errors.text()


def cannot_start(program: str, err: OSError, open_files: int | None) -> str:
    """Why `program` could not start, and what to do. Out of file descriptors (EMFILE: this process's
    `open_files`, reached by a fan-out over many hosts; ENFILE: the system's) is no missing rsync."""
    if err.errno in (errno.EMFILE, errno.ENFILE):
        limit = f"ulimit -n {open_files}" if open_files is not None else "ulimit -n"
        return (f"cannot run {program} here: too many open files on this machine ({limit}); raise that limit, "
                "or give fewer hosts at once (--hosts)")
    return f"cannot run {program} here ({err.strerror}); install rsync"


def _open_files_limit() -> int | None:
    """This process's soft limit on open files; None off Unix or when unlimited."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def local_rsync_problem(program: str, host: str, what: str) -> None:
    """One line, before the first transfer, when this machine's rsync is too old for the options
    every sync passes (it would fail per host with an option error)."""
    if os.path.basename(program) != "rsync":  # a stand-in (tests) or a wrapper: its own business
        return
    version = _version(program)
    if version is not None and version < RSYNC_MIN:
        raise MeshrunError(f"host '{host}': {what}: the rsync on this machine is {'.'.join(map(str, version))}, older "
                           f"than {'.'.join(map(str, RSYNC_MIN))}, which meshrun needs (--mkpath); install a newer "
                           "one (macOS: brew install rsync)")


@functools.lru_cache(maxsize=None)
def _version(program: str) -> tuple[int, ...] | None:
    """`rsync --version`'s version, (0, 0, 0) when it answers without one (openrsync), None when it
    cannot run or fails (said by the transfer itself)."""
    out: list[bytes] = []
    try:
        rc = run_bounded([program, "--version"], timeout=10, on_stdout=out.append, on_stderr=out.append)
    except OSError:
        return None
    found = VERSION_RE.search(b"".join(out))
    if rc != 0:  # it does not answer --version: nothing to judge by (the transfer says what is wrong)
        return None
    return tuple(int(g) for g in found.groups()) if found else (0, 0, 0)


def stderr_tail(lines: Sequence[str]) -> str:
    """rsync's last stderr lines on one line, newest last, escaped; as many as fit in MESSAGE_CHARS."""
    shown: list[str] = []
    size = 0
    for line in reversed(lines):
        text = said(line.strip(), MESSAGE_CHARS)
        if shown and size + len(text) + 3 > MESSAGE_CHARS:
            break
        shown.insert(0, text)
        size += len(text) + 3
    return " | ".join(shown) if shown else "no message"
