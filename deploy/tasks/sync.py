from __future__ import annotations

from fabric import task

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP, ROOT


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "data": "also a dataset: SRC:DEST (local dir : dir on each host, relative to its workdir or absolute)",
            "debug": DEBUG_HELP})
@guarded
def sync(c, hosts="", inventory="", data="", debug=False):
    """Copy the project's code (git-tracked and untracked-not-ignored files), and --data, to each host."""
    from deploy.commands.sync import sync_code, sync_dataset
    from deploy.datasync import parse_data_flag
    from deploy.inventory import inventory_path, load_inventory
    from deploy.selection import select_hosts

    inv = load_inventory(inventory_path(inventory or None))
    spec = parse_data_flag(data) if data else None
    selected = select_hosts(inv, hosts or None)
    renderer = Renderer()
    for result in sync_code(selected, inv, ROOT, renderer).values():
        renderer.info(f"{result.host}: " + ("workdir is this project, nothing to copy" if result.skipped
                                             else f"{result.files} files in sync"))
    if spec is None:
        return
    for item in sync_dataset(selected, inv, ROOT, spec).values():
        sent = f"{len(item.transferred)} sent" if item.transferred else "unchanged, nothing sent"
        renderer.info(f"{item.host}: data {spec.dest}: {item.files} files verified by sha256; {sent}")
        if item.repaired:
            renderer.warn(f"{item.host}: corrupt copies found and sent again: {', '.join(item.repaired)}")
