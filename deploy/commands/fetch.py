"""`fab fetch-checkpoints`: checkpoints, manifest, logs and metrics of a run, home and verified."""

from __future__ import annotations

from pathlib import Path

from common.layout import run_dir
from deploy.edges.fanout import on_each
from deploy.edges.fetch import CHECKPOINTS, FetchReport, fetch_argv, place, remove_staging, transfer, \
    verify_checkpoints
from deploy.inventory.load import load_inventory
from deploy.inventory.model import Host
from deploy.run.shell import local_workdir
from deploy.render.console import HostProgress, Renderer
from deploy.edges.records import RunRecord, resolve_run



def fetch_run(record: RunRecord, root: Path, dest: Path, force: bool, renderer: Renderer) -> list[FetchReport]:
    """Fetch every host of the run in parallel, then assemble the newest checkpoints."""
    inventory = load_inventory(Path(record.inventory))
    hosts = tuple(inventory.host(name) for name in record.hosts)
    home = dest / record.run_id

    def one(host: Host, bars: HostProgress) -> FetchReport:
        report = FetchReport(host.name, home / "hosts" / host.name)
        if host.is_local and (local_workdir(host.workdir, root) / run_dir(record.run_id)).resolve() == home.resolve():
            report.landed = home  # the local default: the run already lives here
            bars.update(host.name, 100)
            return report
        staging = home / ".incoming" / host.name
        staging.mkdir(parents=True, exist_ok=True)
        transfer(fetch_argv(host, record.run_id, staging, root, inventory.known_hosts), host.name, bars.update)
        verify_checkpoints(staging, report)
        place(staging, report.landed, report, force)
        remove_staging(staging)
        return report

    with HostProgress(renderer, "fetch", list(record.hosts)) as bars:
        results = on_each(hosts, lambda h: one(h, bars), timeout=3600).require_all()
    reports = list(results.values())
    incoming = home / ".incoming"
    if incoming.is_dir() and not any(incoming.iterdir()):
        incoming.rmdir()
    _assemble_checkpoints(home, reports, force)
    return reports


def _assemble_checkpoints(home: Path, reports: list[FetchReport], force: bool) -> None:
    """`runs/<id>/checkpoints/` from the host holding the newest verified checkpoint."""
    holders = [r for r in reports if r.newest_step >= 0 and r.landed != home]
    if not holders:
        return
    best = max(holders, key=lambda r: r.newest_step)
    source = best.landed / CHECKPOINTS
    combined = FetchReport(best.host, home / CHECKPOINTS)
    place(source, combined.landed, combined, force, prefix=f"{CHECKPOINTS}/")
    best.conflicts += [c for c in combined.conflicts if c not in best.conflicts]


def main(run: str | None, dest: str, force: bool, root: Path) -> int:
    """`fab fetch-checkpoints`: exit status 1 when a host's copy failed its checksum."""
    record = resolve_run(root, run)
    renderer = Renderer()
    destination = Path(dest) if Path(dest).is_absolute() else root / dest
    reports = fetch_run(record, root, destination, force, renderer)
    renderer.fetch_reports(record.run_id, str(destination / record.run_id), reports)
    corrupt = [f"{r.host}:{name}" for r in reports for name in r.corrupt]
    if corrupt:
        renderer.error(f"checksum mismatch, not kept: {', '.join(corrupt)}; the host's copy is damaged")
        return 1
    return 0
