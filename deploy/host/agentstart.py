"""The agent's start, host side: a detached start (`run --detach` re-runs the agent in a session of
its own and waits for its pidfile), and the one line an agent says instead of a traceback when it
cannot write its run's files (a full disk, a read-only workdir). Standard library only: it runs on hosts.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from meshrun.layout import AGENT_BUSY_EXIT, AGENT_LOCK, AGENT_PIDFILE, TRAIN_LOG, host_dir
from meshrun.deploy.host.agentargs import detached_argv
from meshrun.deploy.host.procs import lock_holder

# The agent could not write its run's files (EX_CANTCREAT): it started nothing, or stopped what it had.
CANNOT_WRITE_EXIT = 73
START_WINDOW_S = 10.0  # how long a detached start waits for its copy's pidfile
# A copy TERMed after its window stops what it started with its own grace: waited for this much longer,
# then KILLed (its torchrun then gets PDEATHSIG). Window, grace (5 s), margin and KILL_WAIT_S together
# (22 s) leave the answer time to reach the controller within its 30 s (deploy/edges/agents.py).
COPY_STOP_MARGIN_S = 5.0
KILL_WAIT_S = 2.0  # after SIGKILL: only a process stuck in the kernel (a hung NFS read) outlives this
EARLY_STDERR_MAX = 64 << 10  # what of the copy's stderr is read: its last line is the answer's reason
PREFIX = "meshrun-agent: "


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def busy_line(run_id: str, host: str, holder: int) -> str:
    """Why an agent started nothing: its run already has one on this host."""
    return (f"{PREFIX}run {run_id} already has an agent on host '{host}' (pid {holder or 'unknown'}, holding "
            f"{host_dir(run_id, host)}/{AGENT_LOCK}); this one started nothing: see it with fab status --run {run_id}")


def cannot_write_line(path: Path | str, host: str, err: OSError, workdir: str) -> str:
    """One line for a run file the agent cannot write: the path, the system's reason and the fix."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = f"free space in {workdir}"
    elif err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = f"make {workdir} writable by this user"
    else:
        fix = f"check the disk of {workdir}"
    return f"{PREFIX}cannot write {path} on {host}: {err.strerror or err}; {fix}"


def quiet_stderr() -> None:
    """A detached copy's stderr is its parent's pipe for the start window only (see start_detached):
    once started, it is /dev/null, so nothing written later meets a pipe nobody reads."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def start_detached(args: argparse.Namespace) -> int:
    """Re-run ourselves in a new session with no controller; print its pidfile, or {"error"} with the
    copy's own reason when it ended without one (its stderr, read over a pipe: a full disk's ENOSPC
    must reach the controller, not the train.log that was never written). A copy still without its
    pidfile when the window ends is stopped before the answer: it was reported as not started while it
    went on to start torchrun, detached, on the host's GPUs, where a Ctrl-C or `fab stop` found nothing."""
    pidfile = Path(host_dir(args.run_id, args.host)) / AGENT_PIDFILE
    # The secrets pass on as they came: through a pipe, never argv or a file.
    child = subprocess.Popen(detached_argv(args, sys.executable), stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    assert child.stdin is not None and child.stderr is not None
    os.set_blocking(child.stderr.fileno(), False)  # a helper that inherited it must not hold our read
    child.stdin.write(json.dumps(args.secret_env).encode() + b"\n")
    child.stdin.close()
    deadline, said = time.monotonic() + START_WINDOW_S, b""
    while time.monotonic() < deadline:
        ended = child.poll() is not None  # before the read: a copy that wrote its pidfile and ended is seen
        said = (said + _early_stderr(child.stderr))[-EARLY_STDERR_MAX:]  # as it comes: a full pipe would block it
        record = read_json(pidfile)
        # Our copy's own pidfile: one left by an earlier agent of the run (or a live one) says nothing of it.
        if record and record.get("run_id") == args.run_id and record.get("agent_pid") == child.pid:
            print(json.dumps(record, sort_keys=True))
            return 0
        if ended:
            break
        time.sleep(0.1)
    said = (said + _early_stderr(child.stderr))[-EARLY_STDERR_MAX:]
    if child.poll() is None:
        print(json.dumps({"error": _stopped_late(args, child, pidfile)}))
        return 1
    print(json.dumps(failed_start(args, child.returncode, said, pidfile)))
    return 1


def _stopped_late(args: argparse.Namespace, child: subprocess.Popen, pidfile: Path) -> str:
    """Stop a copy that wrote no pidfile within the window, and say so. TERM first: its handler is in
    place before it starts anything, and stops all of that with its grace (a TERM before the handler
    ends it with nothing started). KILL only a copy that outlives that grace."""
    assert child.stderr is not None
    child.terminate()
    deadline = time.monotonic() + args.grace + COPY_STOP_MARGIN_S
    while child.poll() is None and time.monotonic() < deadline:
        _early_stderr(child.stderr)  # read on: a copy blocked on a full pipe would never end
        time.sleep(0.1)
    if child.poll() is None:
        child.kill()
        try:
            child.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            return (f"agent did not start within {START_WINDOW_S:g} s, and its copy (pid {child.pid}) outlived "
                    f"SIGKILL; see {pidfile.parent / TRAIN_LOG}")
    return f"agent did not start within {START_WINDOW_S:g} s, so its copy was stopped; see {pidfile.parent / TRAIN_LOG}"


def failed_start(args: argparse.Namespace, rc: int | None, stderr: bytes, pidfile: Path) -> dict:
    """A detached start's answer when its copy wrote no pidfile in time."""
    if rc == AGENT_BUSY_EXIT:  # the controller then hints status, not stop (deploy/run/answers.py)
        return {"error": busy_line(args.run_id, args.host, lock_holder(pidfile.parent / AGENT_LOCK)), "busy": True}
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    if lines:
        said = lines[-1][len(PREFIX):] if lines[-1].startswith(PREFIX) else f"agent did not start: {lines[-1]}"
        return {"error": said}
    return {"error": f"agent did not start; see {pidfile.parent / TRAIN_LOG}"}


def _early_stderr(stream: IO[bytes]) -> bytes:
    """What the copy wrote on stderr since the last read, without waiting (the pipe is non-blocking)."""
    try:
        return stream.read(EARLY_STDERR_MAX) or b""
    except (BlockingIOError, OSError):
        return b""
