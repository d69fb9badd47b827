"""`fab check-network`: connect, gather host facts, probe every link, run one gloo all-reduce
as training would, judge, render. Exit status 0 unless something FAILs."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from deploy.errors import MeshrunError
from deploy.findings import Level
from deploy.inventory import Host, Inventory, inventory_path, load_inventory
from deploy.netcheck import AllReduceResult, ProbeStatus, build_report, has_failures
from deploy.netprobe import gather_facts, open_sessions, probe_pairs, run_allreduce
from deploy.plan import rendezvous_host
from deploy.render import Renderer
from deploy.runs import new_run_id
from deploy.render_check import print_check
from deploy.selection import select_hosts
from deploy.transport import Session

BANDWIDTH_S = 1.0  # per link with --bandwidth: short, so the whole check stays in seconds


@dataclass(frozen=True)
class CheckRequest:
    inventory: str | None
    hosts: str | None
    json: bool = False
    bandwidth: bool = False
    timeout: float = 10.0  # SSH connect timeout per host: what a dead host costs


def check_network(request: CheckRequest, renderer: Renderer, root: Path) -> int:
    started = time.monotonic()
    inventory = load_inventory(inventory_path(request.inventory))
    hosts = select_hosts(inventory, request.hosts)
    head = rendezvous_host(hosts, inventory.rendezvous)
    network = head.network.value
    sessions, unreachable = open_sessions(hosts, inventory, root, request.timeout)
    try:
        facts = gather_facts(hosts, head, sessions, unreachable, sys.executable)
        rdzv, links = probe_pairs(hosts, head, inventory.rendezvous.port, sessions, facts,
                                  BANDWIDTH_S if request.bandwidth else 0.0, sys.executable)
        allreduce = AllReduceResult(ProbeStatus.SKIPPED, "not run: fix the failures above first")
        if not has_failures(build_report(facts, rdzv, links, allreduce, network, 0).findings):
            interfaces = {f.name: f.interface for f in facts if f.interface}
            allreduce = run_allreduce(hosts, inventory, sessions, interfaces, "check-" + new_run_id(), sys.executable)
    finally:
        for session in sessions.values():
            session.close()
    report = build_report(facts, rdzv, links, allreduce, network, time.monotonic() - started)
    if request.json:
        renderer.json(asdict(report))
    else:
        print_check(renderer, report)
    return 1 if report.level is Level.FAIL else 0


def preflight(hosts: tuple[Host, ...], inventory: Inventory, sessions: Mapping[str, Session],
              renderer: Renderer) -> None:
    """The fast part of check-network before a run: versions, torch, GPUs, the rendezvous port
    and all-to-all ports (no all-reduce, no bandwidth). FAILs stop the run; WARNs are shown."""
    started = time.monotonic()
    head = rendezvous_host(hosts, inventory.rendezvous)
    facts = gather_facts(hosts, head, sessions, {}, sys.executable)
    rdzv, links = probe_pairs(hosts, head, inventory.rendezvous.port, sessions, facts, 0.0, sys.executable)
    skipped = AllReduceResult(ProbeStatus.SKIPPED, "not part of the pre-flight")
    report = build_report(facts, rdzv, links, skipped, head.network.value, time.monotonic() - started)
    for finding in report.findings:
        if finding.level is Level.WARN:
            renderer.warn(f"pre-flight: {finding.where}: {finding.message}")
    failed = [f"{f.where}: {f.message}" for f in report.findings if f.level is Level.FAIL]
    if failed:
        raise MeshrunError("pre-flight failed: " + "; ".join(failed) +
                           "; details: fab check-network (or skip with --skip-checks)")
