"""`fab status --watch`: one SSH session per host, opened once and reused, and one question in
flight per host at a time (the agent's status and the usage probe), asked by at most WATCH_WORKERS
threads, oldest question first. Asking never blocks the view:
`rows()` returns at once with what each host last said; a host that stops answering is shown so
after `watchview.NOT_ANSWERING_S` while the others keep updating. Watching only reads: it starts,
stops and writes nothing on a host, so any number of people may watch a run."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

from meshrun.fsutil import not_regular
from meshrun.layout import EVENTS
from meshrun.deploy.edges.agents import run_hosts
from meshrun.deploy.edges.fanout import FANOUT_WORKERS
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import Session, connect
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host import usage as usage_probe
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.hoststate import HostState, parse_status
from meshrun.deploy.run.hostusage import controller_events, read_host_usage
from meshrun.deploy.run.idle import read_usage
from meshrun.deploy.run.progress import Progress
from meshrun.deploy.run.plan import agent_verb_argv, python_of
from meshrun.deploy.run.watchview import HostSeen, WatchView, view

ASK_TIMEOUT_S = 5.0
# Threads asking at once, as many as a fan-out's (deploy/edges/fanout.py): a thousand hosts are not a
# thousand threads, and the hosts behind a jump host reach it over one shared connection
# (deploy/edges/jumps.py), never with a handshake each at once.
WATCH_WORKERS = FANOUT_WORKERS
EVENTS_TAIL = 16 << 10  # bytes of the controller's events file read


def tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a regular file as text; '' when there is none (or it is no file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not_regular(info.st_mode) is not None:
            return ""
        os.lseek(fd, max(0, info.st_size - limit), os.SEEK_SET)
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


class RunWatch:
    def __init__(self, record: RunRecord, root: Path, runs: Path) -> None:
        self.record, self.root = record, root
        self.events_file = runs / record.run_id / EVENTS  # an attached controller's membership events
        self.hosts, self.inventory, missing = run_hosts(record, root)
        self.sessions: dict[str, Session] = {}
        # A host the inventory no longer names is never asked: its row says why.
        self.seen = {name: HostSeen(error=str(missing[name])) if name in missing else HostSeen() for name in record.hosts}
        self.asking: set[str] = set()  # hosts with a question waiting or in flight
        self.waiting: deque[Host] = deque()
        self.workers = 0
        self.lock = threading.Lock()

    def view(self) -> WatchView:
        """Queue a question to every host that has none in flight; the view as last answered."""
        with self.lock:
            for host in self.hosts:
                if host.name not in self.asking:
                    self.asking.add(host.name)
                    self.waiting.append(host)
            start = min(len(self.waiting), WATCH_WORKERS - self.workers)
            self.workers += start
            seen = dict(self.seen)
        for _ in range(start):
            threading.Thread(target=self._work, daemon=True, name="watch-ask").start()
        return view(list(self.record.hosts), seen, time.time(),
                    controller_events(tail(self.events_file, EVENTS_TAIL)))

    def snapshot(self, refresh_s: float, rounds: int = 2) -> WatchView:
        """The view after `rounds` rounds of questions, `refresh_s` apart (for --json)."""
        self.view()
        for _ in range(rounds):
            time.sleep(refresh_s)
            found = self.view()
        return found

    def _work(self) -> None:
        """Ask the waiting hosts, oldest first, until none waits: at most WATCH_WORKERS threads."""
        while True:
            with self.lock:
                if not self.waiting:
                    self.workers -= 1
                    return
                host = self.waiting.popleft()
            try:
                self._ask(host)
            except BaseException:  # a bug: this thread ends, and a later view starts another
                with self.lock:
                    self.workers -= 1
                raise

    def _ask(self, host: Host) -> None:
        try:
            session = self.sessions.get(host.name) or connect(host, self.inventory.known_hosts, self.root,
                                                              ASK_TIMEOUT_S)
            self.sessions[host.name] = session
            status = session.run(agent_verb_argv(host, "status", self.record.run_id, sys.executable),
                                 timeout=ASK_TIMEOUT_S)
            state = parse_status(self.record.run_id, host.name, status.stdout) if status.ok else None
            probe = session.run([python_of(host, sys.executable), "-m", usage_probe.__name__, self.record.run_id,
                                 host.name], timeout=ASK_TIMEOUT_S)
            found = read_usage(host.name, probe.stdout) if probe.ok else None
            extra = read_host_usage(host.name, probe.stdout) if probe.ok else None
            with self.lock:
                old = self.seen[host.name]
                self.seen[host.name] = HostSeen(
                    state, found or old.usage, old.usage if found else old.before, time.time(),
                    None if status.ok else said(status.stderr.strip()[-120:]), extra or old.extra,
                    _earlier(old, state))
        except MeshrunError as err:
            dropped = self.sessions.pop(host.name, None)
            if dropped is not None:
                dropped.close()
            with self.lock:
                self.seen[host.name] = replace(self.seen[host.name], error=said(str(err), 160))
        finally:
            with self.lock:
                self.asking.discard(host.name)

    def close(self) -> None:
        for session in list(self.sessions.values()):
            try:
                session.close()
            except MeshrunError:
                pass


def _earlier(old: HostSeen, state: HostState | None) -> Progress | None:
    """The progress to measure the new one against: the last one that differs from it."""
    last = old.state.progress if old.state is not None else None
    new = state.progress if state is not None else None
    return old.progress_before if last is None or new is None or last.time == new.time else last
