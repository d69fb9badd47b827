"""`fab sync`: the project's code to every selected host, in parallel, one progress bar each."""

from __future__ import annotations

import sys
from pathlib import Path

from deploy.commands.common import connect_all
from deploy.datasync import DataResult, DataSpec, build_manifest, sync_data
from deploy.fanout import on_each, require_all
from deploy.inventory import Host, Inventory
from deploy.plan import python_of
from deploy.render import HostProgress, Renderer
from deploy.sync import SyncResult, project_files, sync_host

SYNC_TIMEOUT_S = 900


def sync_code(hosts: tuple[Host, ...], inventory: Inventory, root: Path, renderer: Renderer) -> dict[str, SyncResult]:
    """Sync to every host; raises one MeshrunError naming each host that failed."""
    files = project_files(root)
    with HostProgress(renderer, "sync", [h.name for h in hosts]) as bars:
        results = on_each(hosts, lambda h: sync_host(h, root, inventory.known_hosts, files, bars.update),
                          timeout=SYNC_TIMEOUT_S)
    return require_all(results)


def sync_dataset(hosts: tuple[Host, ...], inventory: Inventory, root: Path, spec: DataSpec) -> dict[str, DataResult]:
    """The dataset to every host in parallel, verified against its sha256 manifest."""
    manifest = build_manifest(spec.source)
    sessions = connect_all(hosts, inventory, root)
    try:
        results = on_each(hosts, lambda h: sync_data(h, sessions[h.name], python_of(h, sys.executable), spec, manifest,
                                                     root, inventory.known_hosts), timeout=SYNC_TIMEOUT_S)
    finally:
        for session in sessions.values():
            session.close()
    return require_all(results)
