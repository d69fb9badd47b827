from __future__ import annotations

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP, ROOT


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "json": "print the facts and verdicts as JSON",
    "bandwidth": "also measure each link's throughput (about 1 s per link)",
    "timeout": "SSH connect timeout per host in seconds: what a dead host costs", "debug": DEBUG_HELP,
})
@guarded
def check_network(c, hosts="", inventory="", json=False, bandwidth=False, timeout=10, debug=False):
    """Pre-flight check: SSH, versions, GPUs, overlay, all-to-all ports, MTU, and a gloo all-reduce."""
    from deploy.commands.check import CheckRequest, check_network as run_check

    request = CheckRequest(inventory or None, hosts or None, bool(json), bool(bandwidth), float(timeout))
    code = run_check(request, Renderer(), ROOT)
    if code:
        raise Exit(code=code)
