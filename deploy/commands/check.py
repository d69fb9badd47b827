"""`fab check-network`: connect, gather host facts, probe every link, run one gloo all-reduce
as training would, judge, render. Exit status 0 unless something FAILs."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.check.exposure import exposure_findings, with_findings
from meshrun.deploy.check.findings import Level
from meshrun.deploy.check.gpus import busy_findings
from meshrun.deploy.check.ports import store_hosts, successor_findings, successor_names
from meshrun.deploy.check.sincesetup import since_setup
from meshrun.deploy.check.sites import place_links, site_findings
from meshrun.deploy.check.skew import meshrun_findings
from meshrun.deploy.edges.wheel import controller_identity
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.inventory.model import Host, sites_of
from meshrun.deploy.project import Project

from meshrun.deploy.check.verdicts import (AllReduceResult, HostFacts, ProbeStatus, allreduce_budget, build_report,
                                           has_failures)
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.edges.check_probes import gather_facts, open_sessions, probe_network, run_allreduce
from meshrun.deploy.edges.exposure import probe_exposure
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.preflightcache import StoredPass, cache_file, keyed_stamps, load_pass, save_pass, stamp_lines
from meshrun.deploy.run.preflightkey import may_reuse, preflight_key
from meshrun.deploy.run.requirements import declared
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.records import new_run_id
from meshrun.deploy.render.check import print_check
from meshrun.deploy.inventory.selection import Selection, select_hosts
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session

BANDWIDTH_S = 1.0  # per link with --bandwidth: short, so the whole check stays in seconds


@dataclass(frozen=True)
class CheckRequest:
    inventory: str | None
    hosts: str | None
    json: bool = False
    bandwidth: bool = False
    timeout: float = DEFAULT_CONNECT_TIMEOUT_S  # what a dead host costs


def check_network(request: CheckRequest, renderer: Renderer, project: Project) -> int:
    started = time.monotonic()
    inventory = load_inventory(inventory_path(request.inventory, project.root), project.root)
    selection = select_hosts(inventory, request.hosts)
    hosts, head = selection.hosts, selection.head
    network = head.network.value
    sites = sites_of(hosts)
    sessions, unreachable = open_sessions(hosts, inventory, project.root, request.timeout)
    # Each host's setup record of the project's requirements, read beside the facts (deploy/host/stamp.py).
    stamps = Beside(stamp_lines, tuple(h for h in hosts if h.name in sessions), sessions, sys.executable)
    try:
        facts = with_processes(gather_facts(hosts, head, sessions, unreachable, sys.executable), hosts)
        # An inventory with `elastic:` runs elastic: its successors' rendezvous port is checked too, and
        # host clocks too far apart for its regroup FAIL (deploy/check/clocks.py).
        elastic = inventory.elastic is not None
        probed = probe_network(hosts, head, inventory.rendezvous.port, sessions, facts,
                               BANDWIDTH_S if request.bandwidth else 0.0, sys.executable,
                               successor_names(selection, elastic))
        rdzv, links = probed.rendezvous, probed.links
        exposure = probe_exposure(hosts, head, inventory.rendezvous.port, sessions, sys.executable)
        allreduce = AllReduceResult(ProbeStatus.SKIPPED, "not run: fix the failures above first")
        if not has_failures(build_report(facts, rdzv, links, allreduce, network, 0, sites, elastic).findings):
            interfaces = {f.name: f.interface for f in facts if f.interface}
            allreduce = run_allreduce(selection, sessions, interfaces, "check-" + new_run_id(), sys.executable,
                                      allreduce_budget(facts))
        changed = since_setup(hosts, stamps.result(), declared(project.root))
    finally:
        stamps.settle()  # its commands end before their sessions close
        close_all(sessions)
    names = [h.name for h in hosts]
    matrix = [(k.source, k.target, k.mbit_s, k.connect_ms) for k in links if not k.rendezvous]
    # Measured places the inventory does not declare (docs/sites.md): bandwidth tells them.
    places = site_findings(names, sites, matrix) if request.bandwidth else []
    report = with_findings(build_report(facts, rdzv, links, allreduce, network, time.monotonic() - started, sites,
                                        elastic),
                           meshrun_findings(facts, str(controller_identity())) + successor_findings(probed.successors)
                           + busy_findings(facts) + exposure_findings(exposure) + places
                           + changed)
    report = replace(report, places=place_links(names, sites, matrix))
    if request.json:
        renderer.json(asdict(report))
    else:
        print_check(renderer, report)
    return 1 if report.level is Level.FAIL else 0


def with_processes(facts: tuple[HostFacts, ...], hosts: tuple[Host, ...]) -> tuple[HostFacts, ...]:
    """Each host's facts with the processes the launch starts there: which GPUs they train on
    (deploy/check/verdicts.launch_gpus)."""
    processes = {h.name: h.nproc_per_node for h in hosts}
    return tuple(replace(f, processes=processes.get(f.name)) for f in facts)


def preflight(selection: Selection, sessions: Mapping[str, Session], renderer: Renderer,
              cache: Path | None = None, elastic: bool = False, root: Path | None = None) -> bool:
    """The fast part of check-network before a run: versions, torch, GPUs, the rendezvous port
    (for an `elastic` run on every host of its succession too: deploy/check/ports.py) and all-to-all
    ports (no all-reduce, no bandwidth). FAILs stop the run; WARNs are shown.
    A pass without FAILs is reused while its key holds, its warnings shown again
    (deploy/run/preflightkey.py); returns True when this call reused one instead of checking. The
    stamps of the hosts that host the store say whether its port is free now: a busy one is no reuse.
    Every stamp lists its host's busy GPUs (deploy/host/stamp.py): a GPU that filled or freed since
    is a new key, so a reused busy-GPU WARN names the GPUs busy now (its MiB figures are the pass's).
    With the project's `root`, hosts set up with other requirements than it declares now are warned
    of from the same stamps, reuse or not (deploy/check/sincesetup.py): not part of the stored pass,
    since the controller's requirements are not in its key."""
    path = cache or cache_file()
    stores = store_hosts(selection, elastic)
    lines = stamp_lines(selection.hosts, sessions, sys.executable, selection.rendezvous.port, stores)
    for finding in since_setup(selection.hosts, lines, declared(root)) if root is not None else []:
        renderer.warn(f"pre-flight: {finding.where}: {finding.message}")
    stamps = keyed_stamps(lines, selection.hosts, selection.rendezvous.port, stores)
    # This controller's build is in the key: after an upgrade here the hosts' meshrun is checked again.
    # So is elasticity: a plain run's pass never checked the successors' port.
    what = repr((selection.hosts, selection.rendezvous, str(controller_identity())) + (("elastic",) if elastic else ()))
    key = preflight_key(what, stamps) if stamps is not None else None
    stored = load_pass(path)
    now = time.time()
    if key is not None and stored.at is not None and may_reuse(stored.key, stored.at, key, now):
        for warning in stored.warnings:
            renderer.warn(warning)
        renderer.info(reuse_message(now - stored.at, bool(stored.warnings)))
        return True
    warnings = _check_before_run(selection, sessions, renderer, elastic)
    if key is not None:
        save_pass(path, StoredPass(key, time.time(), warnings))
    return False


def reuse_message(age_s: float, warned: bool) -> str:
    """What a reuse says: only what the key covers is claimed unchanged (a disk that filled since is
    not), and replayed warnings are the pass's own, figures and all."""
    return (f"pre-flight: reused the pass of {max(0, round(age_s))} s ago: the hosts, their installs and boot, "
            "the rendezvous port and which GPUs are busy are as it found them"
            + ("; the warnings above are from that pass" if warned else ""))


def _check_before_run(selection: Selection, sessions: Mapping[str, Session], renderer: Renderer,
                      elastic: bool = False) -> tuple[str, ...]:
    """The checks themselves; raises on any FAIL, else returns the warnings it showed."""
    started = time.monotonic()
    hosts, head = selection.hosts, selection.head
    facts = with_processes(gather_facts(hosts, head, sessions, {}, sys.executable), hosts)
    probed = probe_network(hosts, head, selection.rendezvous.port, sessions, facts, 0.0, sys.executable,
                           successor_names(selection, elastic))
    skipped = AllReduceResult(ProbeStatus.SKIPPED, "not part of the pre-flight")
    report = with_findings(build_report(facts, probed.rendezvous, probed.links, skipped, head.network.value,
                                        time.monotonic() - started, sites_of(hosts), elastic),
                           meshrun_findings(facts, str(controller_identity())) + successor_findings(probed.successors)
                           + busy_findings(facts))
    warnings = tuple(f"pre-flight: {f.where}: {f.message}" for f in report.findings if f.level is Level.WARN)
    for warning in warnings:
        renderer.warn(warning)
    failed = [f"{f.where}: {f.message}" for f in report.findings if f.level is Level.FAIL]
    if failed:
        raise MeshrunError("pre-flight failed: " + "; ".join(failed) +
                           "; details: fab check-network (or skip with --skip-checks)")
    return warnings


def main(request: CheckRequest, project: Project) -> int:
    """`fab check-network`; returns the exit status (1 when any verdict is FAIL)."""
    return check_network(request, Renderer(), project)
