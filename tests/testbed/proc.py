"""Running commands and stopping processes by pid.

All commands are argv lists (never ``shell=True``). Processes are only ever
signalled by pid, after checking they belong to one of our namespaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


class CommandError(RuntimeError):
    pass


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float | None = 30,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output; on failure raise with stderr included."""
    args = [os.fspath(a) for a in argv]
    result = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, input=input, check=False
    )
    if check and result.returncode != 0:
        raise CommandError(
            f"{args} exited {result.returncode}: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


NETWORK_NICE = -10


def ahead_of_the_workload() -> None:
    """preexec_fn for the processes that ARE the simulated network (the delayer that holds each
    packet for its delay, wireguard-go that carries the overlay): a link does not slow down when
    its hosts get busy, so they run ahead of the workload's processes. On a loaded 2-core machine
    (the whole suite beside them) they otherwise stretched a profile's delay and cut its
    throughput: 16.9 of 20 Mbit/s, 48 ms of a 40 ms RTT over wg0 (2026-12-01). Root only."""
    os.setpriority(os.PRIO_PROCESS, 0, NETWORK_NICE)


def alive(pid: int) -> bool:
    """True if pid exists and is not a zombie.

    Daemons we start (sshd, wireguard-go) are reparented to PID 1, which on this
    kind of VM reaps only every ~1.5 s: `kill -0` would call a dead sshd alive and
    make every teardown wait. /proc/PID/status says "Z" for those.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    for line in status.splitlines():
        if line.startswith("State:"):
            return "Z" not in line.split()[1]
    return False


def argv_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def read_pidfile(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def netns_inode(netns: str) -> tuple[int, int] | None:
    """(dev, inode) identifying a named network namespace, or None if absent."""
    try:
        st = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in_netns(netns: str) -> list[int]:
    """Live (non-zombie) pids whose network namespace is `netns` (like
    `ip netns pids`, but skipping zombies)."""
    ident = netns_inode(netns)
    if ident is None:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def wait_dead(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until all pids are dead (zombies count as dead); return survivors."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending:
        pending = {p for p in pending if alive(p)}
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return sorted(pending)


def kill_pids(pids: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Send sig to each pid; return those signalled (gone ones are skipped)."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


def stop(pid: int, *, grace: float = 3.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL."""
    if not alive(pid):
        return
    kill_pids([pid], signal.SIGTERM)
    if wait_dead([pid], grace):
        kill_pids([pid], signal.SIGKILL)
        wait_dead([pid], grace)
