"""`fab setup`: a Python environment on each host that runs this project (see deploy/setup_host.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deploy.commands.common import connect_all
from deploy.commands.sync import sync_code
from deploy.errors import MeshrunError
from deploy.fanout import on_each, require_all
from deploy.inventory import Host, Inventory
from deploy.render import Renderer

SETUP_TIMEOUT_S = 3600  # a first install downloads torch


@dataclass(frozen=True)
class SetupResult:
    host: str
    actions: tuple[str, ...]
    python: str
    torch: str | None


def setup_argv(base: str, reuse_site: str | None) -> list[str]:
    return [base, "-m", "deploy.setup_host"] + (["--reuse-site", reuse_site] if reuse_site else [])


def setup_hosts(hosts: tuple[Host, ...], inventory: Inventory, root: Path, renderer: Renderer, base: str,
                reuse_site: str | None) -> dict[str, SetupResult]:
    sessions = connect_all(hosts, inventory, root)
    try:
        sync_code(hosts, inventory, root, renderer)

        def one(host: Host) -> SetupResult:
            result = sessions[host.name].run(setup_argv(base, reuse_site), timeout=SETUP_TIMEOUT_S)
            try:
                data = json.loads(result.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                data = {"error": result.stderr.strip()[-300:] or f"exit status {result.rc}"}
            if "error" in data:
                raise MeshrunError(f"host '{host.name}': setup failed: {data['error']}; is `{base}` a Python >= 3.10 "
                                   f"with venv? (--base PYTHON)")
            return SetupResult(host.name, tuple(data["actions"]), data["python"], data["torch"])

        results = on_each(hosts, one, timeout=SETUP_TIMEOUT_S + 60)
    finally:
        for session in sessions.values():
            session.close()
    return require_all(results)
