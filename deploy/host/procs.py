"""Finding and signalling a run's processes on a host, without ever signalling a stranger:
processes are found by the run's environment tags, never by name, and a process group is
signalled only while its leader is provably the process the agent started. Standard library only.

Tags alone miss a process that drops them: a user's script may start a child with a clean
environment (`env -i`, `Popen(env={...})`), in a session of its own, and exit, so the child is
orphaned. The agent is therefore its run's child subreaper (`become_subreaper`): such an orphan
is re-parented to the agent, not to init, and stays among the agent's descendants, which the
agent signals with the tagged processes (`terminate_run(..., tree=agent pid)`). A process of the
same user can still leave that tree only by a subreaper of its own or by a daemon of the system
(systemd-run, at): out of reach without a cgroup per run.

One agent per run and host: it holds the host dir's lock for its life (`hold_lock`), so a second
agent of the run there refuses (AGENT_BUSY_EXIT) instead of stopping the first one's processes
when its own torchrun ends: both would find the same tagged processes.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Callable

from meshrun.layout import AGENT_MODULE, ENV_HOST, ENV_RUN_ID

POLL_S = 0.2
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# An agent's exit status when another agent of its run holds the host's lock (EX_TEMPFAIL): it started nothing.


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


def program_at_home(argv: tuple[str, ...] | list[str]) -> list[str]:
    """`argv` with a leading `~/` in its program under this user's home: the inventory's `python:
    ~/…` is torchrun's program too, after the agent's `--`, where no shell expanded it."""
    program, *rest = argv
    return [os.path.expanduser(program) if program.startswith("~/") else program, *rest]


def die_with_parent(parent: int, system: str | None = None) -> Callable[[], None] | None:
    """A preexec_fn for torchrun: SIGTERM when the agent dies (even by SIGKILL), so torchrun stops
    its workers instead of running on with nobody to stop them. libc is loaded here, in the
    parent: the child of a threaded process must not import anything before exec. None (no
    preexec_fn) off Linux (`system`: os.uname().sysname unless a test names another), as
    deploy/edges/localproc._parent_death_signal: no other libc has prctl, and its lookup failing in
    the child would be a SubprocessError the agent does not catch, not a torchrun started."""
    if (os.uname().sysname if system is None else system) != "Linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def in_child() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the agent died before the prctl took effect
            os._exit(1)

    return in_child


def become_subreaper() -> bool:
    """Orphans among this process's descendants are re-parented to it (Linux >= 3.4); False where
    the kernel has no such call."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """The live processes below `root` (children, theirs, ...), from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None and len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def below_in_other_sessions(agent: int) -> list[int]:
    """The processes below `agent` but its own helpers (nvidia-smi for the usage feed), which run in
    its session: no process of the run can join that session (torchrun and each worker lead their own)."""
    mine = _field(agent, 3)
    return [p for p in descendants(agent) if _field(p, 3) != mine]


def reap_adopted(agent: int, spared: int) -> None:
    """Reap the exited orphans re-parented to `agent`: nothing else waits for them, and each zombie
    holds a pid against the host's and the container's limits until the agent ends. Only those
    outside its session: its own helpers are waited for by whoever started them."""
    mine = _field(agent, 3)
    for pid in children(agent):
        fields = _stat(pid) if pid != spared else None
        if fields is not None and len(fields) > 3 and fields[0] == b"Z" and int(fields[3]) != mine:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def children(pid: int) -> list[int]:
    """`pid`'s children from /proc/PID/task/*/children: a few small reads, where a scan of /proc reads
    every process's stat (the watch loop asks five times a second, with 32 agents on one test-bed
    machine). Empty where the kernel lacks the file (CONFIG_PROC_CHILDREN)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _field(pid: int, index: int) -> int | None:
    fields = _stat(pid)
    return int(fields[index]) if fields is not None and len(fields) > index else None


def with_offspring(workers: list[int], agent: int, spared: int) -> list[int]:
    """`workers`, what they started, and the orphans re-parented to `agent` (see adopted_orphans)."""
    return sorted({*workers, *(p for w in workers for p in descendants(w)), *adopted_orphans(agent, spared)})


def adopted_orphans(agent: int, spared: int, started_before: int | None = None) -> list[int]:
    """Orphans re-parented to the subreaper `agent`, and what they started: its children but
    `spared` (torchrun) outside its own session (the agent's own helpers, nvidia-smi, run in it).
    With `started_before` (clock ticks since boot, as `start_time`), only the orphans that started
    earlier, each with all it started whenever that was: its tree is the same leftover."""
    mine = _field(agent, 3)

    def in_time(pid: int) -> bool:
        began = start_time(pid)  # None: gone meanwhile
        return started_before is None or (began is not None and began < started_before)

    orphans = [p for p in descendants(agent)
               if p != spared and _field(p, 1) == agent and _field(p, 3) != mine and in_time(p)]
    return [*orphans, *(p for o in orphans for p in descendants(o))]


def session_leader_start(pid: int) -> int | None:
    """`pid`'s start time (clock ticks since boot) if it is alive and leads a session of its own, as
    torch starts each worker (its `SubprocessHandler`: `start_new_session`); else None. A child
    forked but not yet past its `setsid` is None too: not a worker yet."""
    fields = _stat(pid)
    if fields is None or len(fields) <= 19 or fields[0] == b"Z" or int(fields[3]) != pid:
        return None
    return int(fields[19])


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


def tagged_runs(host: str) -> dict[str, list[int]]:
    """{run id: its processes} for every run tagged with this host's name, from one pass over /proc:
    `status` of all runs asks about each, and a pass per run would grow with the runs kept there."""
    prefix, want = f"{ENV_RUN_ID}=".encode(), f"{ENV_HOST}={host}".encode()
    found: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        run_id = next((v[len(prefix):] for v in env if v.startswith(prefix)), None)
        if run_id is not None and want in env and alive(int(entry)):
            found.setdefault(run_id.decode(errors="replace"), []).append(int(entry))
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


def terminate_run(run_id: str, host: str, pgid: int | None, grace_s: float, pgid_start: int | None = None,
                  tree: int | None = None) -> list[int]:
    """TERM the group, the tagged processes and (with `tree`, the agent's pid) every process below
    `tree`; wait `grace_s`, KILL what is left. Returns survivors."""
    if pgid is not None and not _group_is_ours(pgid, pgid_start, run_id, host):
        pgid = None  # the pid was reused by something else: never signal it

    def ours() -> list[int]:
        return sorted(set(tagged_pids(run_id, host) + (below_in_other_sessions(tree) if tree is not None else [])))

    signal_all(pgid, ours(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (ours() or (pgid and alive(pgid))):
        time.sleep(POLL_S)
    for _ in range(25):
        left = ours()
        if not left:
            return []
        if pgid is not None and not _group_is_ours(pgid, pgid_start, run_id, host):
            pgid = None  # emptied and its number taken meanwhile
        signal_all(pgid, left, signal.SIGKILL)
        time.sleep(POLL_S)
    return ours()


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


def is_agent(pid: int, run_id: str) -> bool:
    """`pid` is an agent of run `run_id` (its command line names both): a pidfile's pid may be reused."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return AGENT_MODULE.encode() in cmdline and run_id.encode() in cmdline


def hold_lock(path: Path) -> int | None:
    """Take the exclusive flock on `path` for the rest of this process's life and write our pid in it;
    None once held, else the pid of the process that holds it (0: not yet written). The descriptor
    is never closed and never inherited (O_CLOEXEC): torchrun and the workers do not hold the lock,
    so it is freed the moment this process ends, however it ends, and never outlives it. Raises
    OSError when the file cannot be made or written (a full disk, a read-only workdir)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return lock_holder(path)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        os.close(fd)  # a full disk: the lock is let go with it, and the caller says why it starts nothing
        raise
    return None


def lock_holder(path: Path) -> int:
    """The pid written in a lock file (0 when none can be read: the holder may not have written it yet)."""
    try:
        with open(path, "rb") as f:
            text = f.read(32).strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() and len(text) < 20 else 0
