"""`fab fetch-checkpoints`: checkpoints, manifest, logs and metrics of a run, home and verified."""

from __future__ import annotations

import shutil
from stat import S_ISDIR
from pathlib import Path

from meshrun.layout import CHECKPOINTS, HOSTS, run_dir
from meshrun.deploy.edges.agents import run_hosts
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.project import Project
from meshrun.deploy.edges.fetch import FETCH_ATTEMPTS, FETCH_TIMEOUT_S, FetchReport, Staging, fetch_argv, \
    fetch_verified, place, prepare_staging, remove_staging, skip_lines, stage_verified
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import flag_path_stat
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.render.console import HostProgress, Renderer
from meshrun.deploy.run.shell import local_workdir

INCOMING = ".incoming"  # staging, per host; `.checkpoints` (not a host name) for the assembly
PLACE_S = 600  # after the transfer: hashing and placing what came, on this machine's disk


def fetch_run(record: RunRecord, root: Path, dest: Path, force: bool, renderer: Renderer) -> list[FetchReport]:
    """Fetch every host of the run in parallel, then assemble the newest checkpoints."""
    hosts, inventory = run_hosts(record, root)  # hosts gone from the inventory, bad ssh_config: one line
    home = dest / record.run_id

    def one(host: Host, bars: HostProgress) -> FetchReport:
        report = FetchReport(host.name, home / HOSTS / host.name)
        if host.is_local and (local_workdir(host.workdir, root) / run_dir(record.run_id)).resolve() == home.resolve():
            report.landed = home  # the local default: the run already lives here
            bars.update(host.name, 100)
            return report
        staging = Staging(home / INCOMING / host.name)
        prepare_staging(staging)
        argv = fetch_argv(host, record.run_id, staging, root, inventory.known_hosts)
        fetch_verified(argv, staging, report, bars.update)
        place(staging.tree, report.landed, report, force)
        remove_staging(staging)
        return report

    with HostProgress(renderer, "fetch", list(record.hosts)) as bars:
        deadline = FETCH_ATTEMPTS * FETCH_TIMEOUT_S + PLACE_S
        results = on_each(hosts, lambda h: one(h, bars), timeout=deadline).require_all()
    reports = list(results.values())
    _assemble_checkpoints(home, reports, force)
    incoming = home / INCOMING
    if incoming.is_dir() and not any(incoming.iterdir()):
        incoming.rmdir()
    return reports


def _assemble_checkpoints(home: Path, reports: list[FetchReport], force: bool) -> None:
    """`runs/<id>/checkpoints/`: the verified checkpoints of the host holding the newest one, and
    a manifest of exactly those (nothing else a host put in its folder)."""
    holders = [r for r in reports if r.newest_step >= 0 and r.landed != home]
    if not holders:
        return
    best = max(holders, key=lambda r: r.newest_step)
    assembly = home / INCOMING / f".{CHECKPOINTS}"
    shutil.rmtree(assembly, ignore_errors=True)
    stage_verified(best.landed / CHECKPOINTS, best.verified, assembly)
    combined = FetchReport(best.host, home / CHECKPOINTS)
    place(assembly, combined.landed, combined, force, prefix=f"{CHECKPOINTS}/")
    shutil.rmtree(assembly)
    best.conflicts += [c for c in combined.conflicts if c not in best.conflicts]
    best.refused += combined.refused


def main(run: str | None, dest: str | None, force: bool, project: Project) -> int:
    """`fab fetch-checkpoints`: exit status 1 when a host's checkpoints failed their checksum or
    its manifest had lines meshrun does not accept; what did pass is fetched all the same."""
    renderer = Renderer()
    record = resolve_run(project.runs, run, warn=renderer.warn)
    destination = Path(dest).expanduser().resolve() if dest else project.runs
    found = flag_path_stat("--dest", destination)
    if found is not None and not S_ISDIR(found.st_mode):
        raise InputError(with_path("--dest ", destination, ": exists and is not a directory; name a directory to "
                                   "fetch runs into"))
    reports = fetch_run(record, project.root, destination, force, renderer)
    renderer.fetch_reports(record.run_id, str(destination / record.run_id), reports)
    for line in [line for r in reports for line in skip_lines(r.host, r.skipped)]:
        renderer.warn(line)
    for line in [line for r in reports for line in r.refused]:
        renderer.error(line)
    corrupt = [f"{r.host}:{name}" for r in reports for name in r.corrupt]
    if corrupt:
        renderer.error(f"checksum mismatch, not kept: {', '.join(corrupt)}; the host's copy is damaged")
    return 1 if corrupt or any(r.refused for r in reports) else 0
