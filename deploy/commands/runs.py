"""`fab status`, `fab logs`, `fab stop`: act on a recorded run, reading state from its hosts."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.commands.common import connect_all
from deploy.errors import MeshrunError
from deploy.fanout import on_each
from deploy.inventory import Host, Inventory, load_inventory
from deploy.launch import remote_log_path
from deploy.plan import agent_verb_argv
from deploy.render import Renderer
from deploy.runs import RunRecord
from deploy.transport import Session, connect

STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class HostState:
    """What one host's agent says about a run (`python -m deploy.agent status`)."""

    run_id: str
    host: str
    state: str  # running | exited | stopped | lost | unreachable
    rc: int | None = None
    epoch: int | None = None
    step: int | None = None
    uptime_s: float | None = None
    detail: str | None = None


def _hosts_of(record: RunRecord) -> tuple[tuple[Host, ...], Inventory]:
    inventory = load_inventory(Path(record.inventory))
    known = {h.name: h for h in inventory.hosts}
    missing = [h for h in record.hosts if h not in known]
    if missing:
        raise MeshrunError(f"run {record.run_id}: host(s) {', '.join(missing)} are no longer in {record.inventory}")
    return tuple(known[h] for h in record.hosts), inventory


def _parse_state(host: str, reports: list[dict]) -> HostState:
    report = reports[0]
    progress = report.get("progress") or {}
    end = report.get("ended") or report.get("now")
    uptime = (end - report["started"]) if end and report.get("started") else None
    return HostState(report["run_id"], host, report["state"], report.get("rc"), progress.get("epoch"),
                     progress.get("global_step"), uptime, report.get("reason"))


def host_states(record: RunRecord, root: Path, timeout: float = 10.0) -> list[HostState]:
    """Every host's view of the run; an unreachable host is a state, not an error."""
    hosts, inventory = _hosts_of(record)

    def ask(host: Host) -> HostState:
        session = connect(host, inventory.known_hosts, root, timeout)
        try:
            result = session.run(agent_verb_argv(host, "status", record.run_id, sys.executable), timeout=timeout)
        finally:
            session.close()
        reports = json.loads(result.stdout or "[]") if result.ok else []
        return _parse_state(host.name, reports) if reports else HostState(record.run_id, host.name, "unknown",
                                                                            detail=result.stderr.strip()[-200:] or None)

    results = on_each(hosts, ask, timeout=timeout + 20)
    return [r if isinstance(r, HostState) else HostState(record.run_id, name, "unreachable", detail=str(r))
            for name, r in results.items()]


def stop_run(record: RunRecord, root: Path) -> dict[str, tuple[int, ...] | MeshrunError]:
    """Stop the run on every host; {host: pids still alive (should be empty) or the error}."""
    return stop_hosts(record, root, record.hosts)


def stop_hosts(record: RunRecord, root: Path, names: tuple[str, ...]) -> dict[str, tuple[int, ...] | MeshrunError]:
    """Stop the run on the named hosts of the run."""
    hosts, inventory = _hosts_of(record)
    hosts = tuple(h for h in hosts if h.name in names)
    sessions = connect_all(hosts, inventory, root)

    def stop(host: Host) -> tuple[int, ...]:
        result = sessions[host.name].run(agent_verb_argv(host, "stop", record.run_id, sys.executable, STOP_GRACE_S),
                                         timeout=STOP_GRACE_S + 25)
        try:
            return tuple(json.loads(result.stdout.strip().splitlines()[-1])["remaining"])
        except (ValueError, IndexError, KeyError):
            raise MeshrunError(f"host '{host.name}': stop gave no report: {result.stderr.strip()[-200:]}") from None

    try:
        return on_each(hosts, stop, timeout=STOP_GRACE_S + 40)  # type: ignore[return-value]
    finally:
        for session in sessions.values():
            session.close()


def show_logs(record: RunRecord, root: Path, renderer: Renderer, follow: bool, lines: int) -> None:
    """Each host's train.log (the last `lines`), prefixed; with `follow`, until Ctrl-C."""
    hosts, inventory = _hosts_of(record)
    sessions = connect_all(hosts, inventory, root)
    try:
        if not follow:
            for host in hosts:
                result = sessions[host.name].run(["tail", "-n", str(lines), remote_log_path(record.run_id, host.name)])
                for line in result.stdout.splitlines():
                    renderer.log_line(host.name, line if line.startswith(f"[{host.name}:") else f"[{host.name}] {line}")
            return
        _follow(hosts, sessions, record, renderer, lines)
    finally:
        for session in sessions.values():
            session.close()


def _follow(hosts: tuple[Host, ...], sessions: dict[str, Session], record: RunRecord, renderer: Renderer,
            lines: int) -> None:
    streams = {h.name: sessions[h.name].start(["tail", "-n", str(lines), "-F",
                                               remote_log_path(record.run_id, h.name)]) for h in hosts}

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
