"""`fab logs [-f]`: a run's logs from every host, prefixed [host:rank]. A host that cannot be
reached is named and the others are shown (or followed) all the same; where this machine holds a
copy of its log (an attached run's stream, a fetched train.log), that copy is shown instead, under
a warning naming the file: a finished run's hosts are often gone, its log is not."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from meshrun.fsutil import not_regular, open_regular
from meshrun.layout import HOSTS, TRAIN_LOG, controller_log, log_path
from meshrun.deploy.commands.logsfollow import Follower, none_left
from meshrun.deploy.edges.agents import CONNECT_BUDGET_S, on_each_connected, run_hosts, run_states, with_missing
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import RunRecord, resolve_live_run
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session, Stream, connect
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.hoststate import HostState


TAIL_TIMEOUT_S = 60  # one host's `tail` of its log
# Of this machine's copy of a host's log: bytes read per line asked for, and at most, whatever the file's size.
COPY_LINE_BYTES = 2048
COPY_READ_MAX = 16 << 20
FOLLOWING_WITHOUT = "; following the other hosts without it"


def tail_argv(record: RunRecord, host: str, lines: int, follow: bool = False) -> list[str]:
    return ["tail", "-n", str(lines), *(["-F"] if follow else []), log_path(record.run_id, host)]


def shown_line(host: str, text: str) -> str:
    """A line of `host`'s log as shown: with its own `[host:rank]` or `[host] ` prefix (the controller's
    copy has one on every line, deploy/edges/hostlines.py), else `[host]` (a line that names another
    host is this one's all the same)."""
    return text if text.startswith((f"[{host}:", f"[{host}] ")) else f"[{host}] {text}"


def show_logs(record: RunRecord, root: Path, runs: Path, renderer: Renderer, follow: bool, lines: int) -> None:
    """Each host's train.log (the last `lines`), prefixed; with `follow`, until Ctrl-C or no host is left
    to follow (each stopped answering SSH or its stream ended, said in a line each). A host that
    cannot be reached, or keeps no log, is shown from this machine's copy where there is one."""
    hosts, inventory, missing = run_hosts(record, root)
    if follow:
        _follow(hosts, inventory, root, runs, record, renderer, lines, missing)
        return
    # All hosts at once, each within TAIL_TIMEOUT_S: one after another, silent hosts added up.
    tails = with_missing(on_each_connected(hosts, inventory, root,
                                           lambda h, s: s.run(tail_argv(record, h.name, lines), timeout=TAIL_TIMEOUT_S),
                                           timeout=CONNECT_BUDGET_S + TAIL_TIMEOUT_S + 5), missing, record.hosts)
    missed = []
    for name in tails:
        if name in tails.failed:
            if not show_copy(runs, record.run_id, name, str(tails.failed[name]), renderer, lines):
                renderer.warn(str(tails.failed[name]))
                missed.append(name)
            continue
        answer = tails.ok[name]
        # A host that answers but keeps no log (its workdir wiped, a new machine at the old address).
        gone = f"host '{name}' has no log of run {record.run_id} there: {said(answer.stderr.strip()[-200:])}"
        if not answer.ok and show_copy(runs, record.run_id, name, gone, renderer, lines):
            continue
        for line in answer.stdout.splitlines():
            renderer.log_line(name, shown_line(name, line))
    # A host only an earlier attempt used (left out by --resume, often dead) is the warning above.
    if missed := [name for name in missed if name not in record.earlier]:
        raise MeshrunError(f"no log from {', '.join(missed)}; see the lines above")


@dataclass(frozen=True)
class LocalCopy:
    """A host's log of a run as this machine holds it."""

    path: Path
    mtime: float


def local_copies(runs: Path, run_id: str, host: str) -> tuple[Path, Path]:
    """Where this machine may hold `host`'s log of the run: the attached controller's copy of every
    line the host streamed (deploy/edges/launcher.py), and the host's own train.log as `fab
    fetch-checkpoints` lands it (the host's run directory, which holds `hosts/<host>/train.log`,
    under `runs/<id>/hosts/<host>/`)."""
    home = runs / run_id
    return home / controller_log(host), home / HOSTS / host / HOSTS / host / TRAIN_LOG


def local_copy(runs: Path, run_id: str, host: str) -> LocalCopy | None:
    """The newest regular file of `local_copies` (a run resumed detached after an attached attempt
    has its later lines in the fetched one; of two as new, the controller's); None: there is none."""
    found = []
    for path in local_copies(runs, run_id, host):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if not_regular(info.st_mode) is None:
            found.append(LocalCopy(path, info.st_mtime))
    return max(found, key=lambda c: c.mtime, default=None)


def last_lines(text: str, lines: int, whole: bool) -> list[str]:
    """The last `lines` lines of `text`, the end of a file; unless `whole` (read from the file's start),
    its first line is the cut end of one and is left out."""
    found = text.splitlines()[0 if whole else 1:]
    return found[-lines:] if lines > 0 else []


def copy_warning(why: str, copy: LocalCopy, shown: int, after: str = "") -> str:
    """The one line over a host's log shown from this machine's copy: why not from the host, which file."""
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(copy.mtime))
    return f"{why}; its last {shown} line(s) from this machine's copy instead: {copy.path} (written {at}){after}"


def _read_end(path: Path, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of the regular file `path`, and whether they are all of it."""
    fd = open_regular(path)  # a FIFO must not block; one swapped in since `local_copy` is refused
    try:
        info = os.fstat(fd)
        start = max(0, info.st_size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        return os.read(fd, limit), start == 0
    finally:
        os.close(fd)


def show_copy(runs: Path, run_id: str, host: str, why: str, renderer: Renderer, lines: int, after: str = "") -> bool:
    """`host`'s log from this machine's copy (`local_copy`), under a warning that says `why` and names
    the file, each line as a host's line is shown, at most `lines` of them read from a bounded end of
    the file; False, with nothing shown, when there is no copy to read."""
    copy = local_copy(runs, run_id, host)
    if copy is None:
        return False
    try:
        data, whole = _read_end(copy.path, min(max(lines, 1) * COPY_LINE_BYTES, COPY_READ_MAX))
    except OSError:
        return False  # gone or replaced since it was found: no copy after all
    found = last_lines(data.decode(errors="replace"), lines, whole)
    renderer.warn(copy_warning(why, copy, len(found), after))
    for line in found:
        renderer.log_line(host, shown_line(host, line))
    return True


def _follow(hosts: tuple[Host, ...], inventory: Inventory, root: Path, runs: Path, record: RunRecord,
            renderer: Renderer, lines: int, missing: dict[str, MeshrunError]) -> None:
    """Each host's tail -F, started at once through its own session: a host that cannot be reached
    is a warning (over its log from this machine's copy, where there is one), and the others are
    followed until Ctrl-C; a host that stops answering, or whose stream ends, is said and left
    (deploy/commands/logsfollow.py), and once none is left it is a MeshrunError."""
    opened: dict[str, Session] = {}
    lock, over = threading.Lock(), threading.Event()

    def start(host: Host) -> Stream:
        session = connect(host, inventory.known_hosts, root)
        with lock:
            late = over.is_set()  # connected after the fan-out gave up on it: nothing would read it
            if not late:
                opened[host.name] = session
        if late:
            close_all({host.name: session})
            raise MeshrunError(f"host '{host.name}': connected too late to be followed")
        return session.start(tail_argv(record, host.name, lines, follow=True))

    try:
        # The connect, then the start's answer (within the connect timeout: SshSession.start).
        started = on_each(hosts, start, timeout=CONNECT_BUDGET_S + DEFAULT_CONNECT_TIMEOUT_S)
        with lock:
            over.set()  # from now on a connect that comes is closed at once: its tail would never be read
        failed = with_missing(started, missing, record.hosts).failed
        unseen = [name for name, err in failed.items()
                  if not show_copy(runs, record.run_id, name, str(err), renderer, lines, "; not followed")]
        for name in unseen:
            renderer.warn(f"{failed[name]}{FOLLOWING_WITHOUT}")
        if not started.ok and unseen:
            raise MeshrunError(f"no log to follow: no host of run {record.run_id} could be reached; "
                               "see the lines above")
        if not started.ok:
            return  # every host's copy is shown above, and nothing is left to follow
        follower = Follower(started.ok, {name: opened[name] for name in started.ok},
                            lambda name, text: renderer.log_line(name, shown_line(name, text)), renderer.warn)
        if not follower.run():  # each host stopped answering or its stream ended, each said above
            raise MeshrunError(none_left(record.run_id))
    finally:
        with lock:
            over.set()
        close_all(opened)


def main(run: str | None, follow: bool, lines: int, project: Project) -> None:
    renderer = Renderer()
    asked: list[HostState] = []

    def ask(live: list[RunRecord]) -> list[HostState]:
        asked.extend(run_states(live, project.root))
        return asked

    # With no --run, the one run that may still be running; several are refused, named (resolve_live_run).
    record = resolve_live_run(project.runs, run, "fab logs", renderer.warn, ask)
    if run is None:  # taken, not named: which run, before any line of it (an old detached run's are no warning)
        renderer.info(picked(record, asked))
    show_logs(record, project.root, project.runs, renderer, follow, lines)


def picked(record: RunRecord, states: list[HostState]) -> str:
    """Which run a bare `fab logs` shows and why that one. `states`: the hosts' answers, when several
    runs may still be running (none asked: it was the one); a detached run gets no summary, so one
    that ended long ago may be the one."""
    if not states:
        why = "the one run that may still be running"
    elif any(s.run_id == record.run_id and s.state == "running" for s in states):
        why = "the one its hosts say is running"
    else:
        why = "the newest that may still be running; no host says any run is"
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.started))
    kind = "detached" if record.detached else "attached"
    hosts = ",".join(record.members)
    return f"run {record.run_id} ({kind}, started {at} on {hosts}: {why}); another: fab logs --run ID"
