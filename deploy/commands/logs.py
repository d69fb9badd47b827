"""`fab logs [-f]`: a run's logs from every host, prefixed [host:rank]."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from meshrun.layout import log_path
from meshrun.deploy.edges.agents import run_hosts
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.render.console import Renderer


TAIL_TIMEOUT_S = 60  # one host's `tail` of its log


def show_logs(record: RunRecord, root: Path, renderer: Renderer, follow: bool, lines: int) -> None:
    """Each host's train.log (the last `lines`), prefixed; with `follow`, until Ctrl-C."""
    hosts, inventory = run_hosts(record, root)
    with sessions_to(hosts, inventory, root) as sessions:
        if not follow:
            # All hosts at once, each within TAIL_TIMEOUT_S: one after another, silent hosts added up.
            tails = on_each(hosts, lambda h: sessions[h.name].run(["tail", "-n", str(lines),
                                                                   log_path(record.run_id, h.name)],
                                                                  timeout=TAIL_TIMEOUT_S), timeout=TAIL_TIMEOUT_S + 5)
            for host in hosts:
                if host.name in tails.failed:
                    renderer.warn(str(tails.failed[host.name]))
                    continue
                for line in tails.ok[host.name].stdout.splitlines():
                    renderer.log_line(host.name, line if line.startswith(f"[{host.name}:") else f"[{host.name}] {line}")
            if tails.failed:
                raise MeshrunError(f"no log from {', '.join(tails.failed)}; see the lines above")
            return
        _follow(hosts, sessions, record, renderer, lines)


def _follow(hosts: tuple[Host, ...], sessions: dict[str, Session], record: RunRecord, renderer: Renderer,
            lines: int) -> None:
    streams = {h.name: sessions[h.name].start(["tail", "-n", str(lines), "-F",
                                               log_path(record.run_id, h.name)]) for h in hosts}

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
    show_logs(resolve_run(project.runs, run, live_only=True, warn=renderer.warn), project.root, renderer, follow, lines)
