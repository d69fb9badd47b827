from __future__ import annotations

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded, remainder
from deploy.plan import DEFAULT_PG_TIMEOUT_S, Workload
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, HOSTS_HELP, INVENTORY_HELP, ROOT


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
    "config": "trainer config YAML (default train/configs/digits.yaml)",
    "script": "run this torchrun-compatible script instead of the trainer; its arguments go after --",
    "nnodes": "elastic bounds MIN:MAX (default: the inventory's `elastic`, else fixed)",
    "timeout": "process-group timeout in seconds: how long a lost peer may stall a collective",
    "detach": "start the run and return its id", "skip_checks": "skip the pre-flight checks",
    "no_sync": "do not sync the code first", "debug": DEBUG_HELP,
    "resume": "continue an earlier run (its id) from its newest checkpoint, on its hosts by default",
    "comm": "gradient communication: none|fp16|bf16|powersgd|localsgd, or auto (measure the links, pick by the floor)",
})
@guarded
def train(c, hosts="", inventory="", config="", script="", nnodes="", timeout=DEFAULT_PG_TIMEOUT_S,
          detach=False, skip_checks=False, no_sync=False, resume="", comm="", debug=False):
    """Train on the selected hosts: one synchronized torchrun per host, live logs, summary."""
    from deploy.commands.train import TrainRequest, train as run_train

    workload = Workload(script=script or None, config=config or None, args=remainder())
    request = TrainRequest(inventory or None, hosts or None, workload, nnodes or None, int(timeout),
                           detach, skip_checks, no_sync, resume or None, comm or None)
    code = run_train(request, Renderer(), ROOT)
    if code:
        raise Exit(code=code)
