"""`fab logs [-f]`: a run's logs from every host, prefixed [host:rank]. A host that cannot be
reached is named and the others are shown (or followed) all the same."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from meshrun.layout import log_path
from meshrun.deploy.edges.agents import CONNECT_BUDGET_S, on_each_connected, run_hosts, run_states, with_missing
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import RunRecord, resolve_live_run
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session, Stream, connect
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.render.console import Renderer


TAIL_TIMEOUT_S = 60  # one host's `tail` of its log


def tail_argv(record: RunRecord, host: str, lines: int, follow: bool = False) -> list[str]:
    return ["tail", "-n", str(lines), *(["-F"] if follow else []), log_path(record.run_id, host)]


def show_logs(record: RunRecord, root: Path, renderer: Renderer, follow: bool, lines: int) -> None:
    """Each host's train.log (the last `lines`), prefixed; with `follow`, until Ctrl-C."""
    hosts, inventory, missing = run_hosts(record, root)
    if follow:
        for err in missing.values():
            renderer.warn(f"{err}; following the other hosts without it")
        _follow(hosts, inventory, root, record, renderer, lines)
        return
    # All hosts at once, each within TAIL_TIMEOUT_S: one after another, silent hosts added up.
    tails = with_missing(on_each_connected(hosts, inventory, root,
                                           lambda h, s: s.run(tail_argv(record, h.name, lines), timeout=TAIL_TIMEOUT_S),
                                           timeout=CONNECT_BUDGET_S + TAIL_TIMEOUT_S + 5), missing, record.hosts)
    for name in tails:
        if name in tails.failed:
            renderer.warn(str(tails.failed[name]))
            continue
        for line in tails.ok[name].stdout.splitlines():
            renderer.log_line(name, line if line.startswith(f"[{name}:") else f"[{name}] {line}")
    # A host only an earlier attempt used (left out by --resume, often dead) is the warning above.
    if missed := [name for name in tails.failed if name not in record.earlier]:
        raise MeshrunError(f"no log from {', '.join(missed)}; see the lines above")


def _follow(hosts: tuple[Host, ...], inventory: Inventory, root: Path, record: RunRecord, renderer: Renderer,
            lines: int) -> None:
    """Each host's tail -F, started at once through its own session: a host that cannot be reached
    is a warning, and the others are followed."""
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
        for err in started.failed.values():
            renderer.warn(f"{err}; following the other hosts without it")
        if not started.ok:
            raise MeshrunError(f"no log to follow: no host of run {record.run_id} could be reached; "
                               "see the lines above")
        _pump(started.ok, renderer)
    finally:
        with lock:
            over.set()
        close_all(opened)


def _pump(streams: dict[str, Stream], renderer: Renderer) -> None:
    """Every stream's lines to the console, until each ends or Ctrl-C."""
    def pump(name: str) -> None:
        while raw := streams[name].readline():
            text = raw.decode(errors="replace").rstrip("\r\n")
            renderer.log_line(name, text if text.startswith(f"[{name}:") else f"[{name}] {text}")

    threads = [threading.Thread(target=pump, args=(n,), daemon=True) for n in streams]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for stream in streams.values():
            stream.abandon()


def main(run: str | None, follow: bool, lines: int, project: Project) -> None:
    renderer = Renderer()
    # With no --run, the one run that may still be running; several are refused, named (resolve_live_run).
    record = resolve_live_run(project.runs, run, "fab logs", renderer.warn, lambda live: run_states(live, project.root))
    show_logs(record, project.root, renderer, follow, lines)
