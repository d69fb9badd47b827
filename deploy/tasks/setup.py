from __future__ import annotations

from fabric import task

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP, ROOT


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "base": "interpreter on the host that creates the venv (default python3)",
            "reuse_site": "let the venv also see this interpreter's packages (e.g. a shared env with torch)",
            "debug": DEBUG_HELP})
@guarded
def setup(c, hosts="", inventory="", base="python3", reuse_site="", debug=False):
    """Prepare each host's Python: <workdir>/.venv with this project installed (idempotent)."""
    from deploy.commands.setup import setup_hosts
    from deploy.inventory import inventory_path, load_inventory
    from deploy.selection import select_hosts

    inv = load_inventory(inventory_path(inventory or None))
    selected = select_hosts(inv, hosts or None)
    renderer = Renderer()
    results = setup_hosts(selected, inv, ROOT, renderer, base, reuse_site or None)
    for host in selected:
        result = results[host.name]
        done = "; ".join(result.actions) or "already set up, nothing to do"
        renderer.info(f"{host.name}: {done}; python {result.python} (torch {result.torch or 'NOT importable'})")
        if host.python != result.python and not host.is_local:
            renderer.warn(f"{host.name}: the inventory's `python` is {host.python or 'unset'}; set "
                          f"`python: {result.python}` for it in {inv.path} to train with this environment")
