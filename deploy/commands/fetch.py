"""`fab fetch-checkpoints`: checkpoints, manifest, logs and metrics of a run, home and verified."""

from __future__ import annotations

from pathlib import Path

from deploy.fanout import on_each, require_all
from deploy.fetch import CHECKPOINTS, FetchReport, fetch_argv, place, remove_staging, transfer, \
    verify_checkpoints
from deploy.inventory import Host, load_inventory
from deploy.remote import local_workdir
from deploy.render import HostProgress, Renderer
from deploy.runs import RunRecord
from deploy.plan import run_dir


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
        results = require_all(on_each(hosts, lambda h: one(h, bars), timeout=3600))
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
