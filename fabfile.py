"""meshrun's fab tasks. Thin: each task parses its flags and hands over to deploy.commands.

Tasks that act on many hosts declare `hosts` themselves: a Fabric task without it is cloned
per host and run one host after another, which would start torchrun on gpu1 and never on gpu2.
"""

from __future__ import annotations

from pathlib import Path

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded, remainder
from deploy.plan import DEFAULT_PG_TIMEOUT_S, Workload
from deploy.render import Renderer

ROOT = Path(__file__).resolve().parent

HOSTS_HELP = "hosts, groups or host:0,1 (GPU override), comma-separated; default: all"
INVENTORY_HELP = "inventory YAML (default: $MESHRUN_INVENTORY or inventory/local.yaml)"


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
    "config": "trainer config YAML (default train/configs/digits.yaml)",
    "script": "run this torchrun-compatible script instead of the trainer; its arguments go after --",
    "nnodes": "elastic bounds MIN:MAX (default: the inventory's `elastic`, else fixed)",
    "timeout": "process-group timeout in seconds: how long a lost peer may stall a collective",
    "detach": "start the run and return its id", "skip_checks": "skip the pre-flight checks",
    "no_sync": "do not sync the code first", "debug": "show tracebacks of internal errors",
})
@guarded
def train(c, hosts="", inventory="", config="", script="", nnodes="", timeout=DEFAULT_PG_TIMEOUT_S,
          detach=False, skip_checks=False, no_sync=False, debug=False):
    """Train on the selected hosts: one synchronized torchrun per host, live logs, summary."""
    from deploy.commands.train import TrainRequest, train as run_train

    args = remainder()
    workload = Workload(script=script or None, config=config or None, args=args)
    request = TrainRequest(inventory or None, hosts or None, workload, nnodes or None, int(timeout),
                           detach, skip_checks, no_sync)
    code = run_train(request, Renderer(), ROOT)
    if code:
        raise Exit(code=code)


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "debug": "show tracebacks of internal errors"})
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
