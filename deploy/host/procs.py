"""Finding and signalling a run's processes on a host, without ever signalling a stranger:
processes are found by the run's environment tags, never by name, and a process group is
signalled only while its leader is provably the process the agent started. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Callable

from meshrun.layout import ENV_HOST, ENV_RUN_ID

POLL_S = 0.2
PR_SET_PDEATHSIG = 1


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True for a live, non-zombie process."""
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z"


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: with the pid, it names one process
    for good (a pid alone may be reused)."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn for torchrun: SIGTERM when the agent dies (even by SIGKILL), so torchrun stops
    its workers instead of running on with nobody to stop them. libc is loaded here, in the
    parent: the child of a threaded process must not import anything before exec."""
    libc = ctypes.CDLL(None, use_errno=True)

    def in_child() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the agent died before the prctl took effect
            os._exit(1)

    return in_child


def tagged_pids(run_id: str, host: str) -> list[int]:
    """Processes whose environment carries this run's id and this host's name."""
    want = {f"{ENV_RUN_ID}={run_id}".encode(), f"{ENV_HOST}={host}".encode()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env and alive(int(entry)):
            found.append(int(entry))
    return found


def signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_run(run_id: str, host: str, pgid: int | None, grace_s: float, pgid_start: int | None = None) -> list[int]:
    """TERM the group and tagged processes, wait `grace_s`, KILL what is left. Returns survivors."""
    if pgid is not None and not _group_is_ours(pgid, pgid_start, run_id, host):
        pgid = None  # the pid was reused by something else: never signal it
    signal_all(pgid, tagged_pids(run_id, host), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (tagged_pids(run_id, host) or (pgid and alive(pgid))):
        time.sleep(POLL_S)
    for _ in range(25):
        left = tagged_pids(run_id, host)
        if not left:
            return []
        signal_all(pgid, left, signal.SIGKILL)
        time.sleep(POLL_S)
    return tagged_pids(run_id, host)


def _group_is_ours(pgid: int, recorded_start: int | None, run_id: str, host: str) -> bool:
    """Whether `pgid` still names the group torchrun led. Its leader, if there is one (a zombie
    counts), must be the very process we started: same start time. With no leader left at all the
    number cannot have been reused while any member of the group lives."""
    now = start_time(pgid)
    if now is None:
        return True
    if recorded_start is not None:
        return now == recorded_start
    return alive(pgid) and pgid in tagged_pids(run_id, host)
