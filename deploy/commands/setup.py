"""`fab setup`: a Python environment on each host that runs this project (see deploy/host/setup.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deploy.edges.sessions import sessions_to
from deploy.commands.sync import sync_code
from deploy.errors import MeshrunError
from deploy.edges.fanout import on_each
from deploy.inventory.load import inventory_path, load_inventory
from deploy.inventory.model import Host, Inventory
from deploy.inventory.selection import select_hosts
from deploy.render.console import Renderer

SETUP_TIMEOUT_S = 3600  # a first install downloads torch


@dataclass(frozen=True)
class SetupResult:
    host: str
    actions: tuple[str, ...]
    python: str
    torch: str | None


def setup_argv(base: str, reuse_site: str | None) -> list[str]:
    return [base, "-m", "deploy.host.setup"] + (["--reuse-site", reuse_site] if reuse_site else [])


def setup_hosts(hosts: tuple[Host, ...], inventory: Inventory, root: Path, renderer: Renderer, base: str,
                reuse_site: str | None) -> dict[str, SetupResult]:
    with sessions_to(hosts, inventory, root) as sessions:
        sync_code(hosts, inventory, root, renderer)

        def one(host: Host) -> SetupResult:
            result = sessions[host.name].run(setup_argv(base, reuse_site), timeout=SETUP_TIMEOUT_S)
            try:
                data = result.last_json()
            except (ValueError, IndexError):
                data = {"error": result.stderr.strip()[-300:] or f"exit status {result.rc}"}
            if "error" in data:
                raise MeshrunError(f"host '{host.name}': setup failed: {data['error']}; is `{base}` a Python >= 3.10 "
                                   f"with venv? (--base PYTHON)")
            return SetupResult(host.name, tuple(data["actions"]), data["python"], data["torch"])

        results = on_each(hosts, one, timeout=SETUP_TIMEOUT_S + 60)
    return results.require_all()


def main(inventory_arg: str | None, hosts_arg: str | None, base: str, reuse_site: str | None, root: Path) -> None:
    """`fab setup`: set up each selected host, then say what to put in the inventory."""
    inv = load_inventory(inventory_path(inventory_arg))
    selected = select_hosts(inv, hosts_arg).hosts
    renderer = Renderer()
    results = setup_hosts(selected, inv, root, renderer, base, reuse_site)
    for host in selected:
        result = results[host.name]
        done = "; ".join(result.actions) or "already set up, nothing to do"
        renderer.info(f"{host.name}: {done}; python {result.python} (torch {result.torch or 'NOT importable'})")
        if host.python != result.python and not host.is_local:
            renderer.warn(f"{host.name}: the inventory's `python` is {host.python or 'unset'}; set "
                          f"`python: {result.python}` for it in {inv.path} to train with this environment")
