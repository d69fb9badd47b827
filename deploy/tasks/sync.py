from __future__ import annotations

from fabric import task

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP, ROOT


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "debug": DEBUG_HELP})
@guarded
def sync(c, hosts="", inventory="", debug=False):
    """Copy the project's code (git-tracked and untracked-not-ignored files) to each host's workdir."""
    from deploy.commands.sync import sync_code
    from deploy.inventory import inventory_path, load_inventory
    from deploy.selection import select_hosts

    inv = load_inventory(inventory_path(inventory or None))
    renderer = Renderer()
    for result in sync_code(select_hosts(inv, hosts or None), inv, ROOT, renderer).values():
        renderer.info(f"{result.host}: " + ("workdir is this project, nothing to copy" if result.skipped
                                             else f"{result.files} files in sync"))
