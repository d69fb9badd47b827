"""The fab tasks: flags and help only, re-exported by `fabfile.py`. Every behaviour lives in
`deploy/commands/<task>.py`, imported lazily so that `fab -l` stays fast.

Tasks that act on many hosts declare `hosts` themselves: a Fabric task without it is cloned per
host and run one host after another, which would start torchrun on gpu1 and never on gpu2.
"""

from __future__ import annotations

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded, remainder
from common.layout import DEFAULT_PG_TIMEOUT_S
from deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S
from deploy.project import ROOT

HOSTS_HELP = "hosts, groups or host:0,1 (GPU override), comma-separated; default: all"
INVENTORY_HELP = "inventory YAML (default: $MESHRUN_INVENTORY or inventory/local.yaml)"
DEBUG_HELP = "show tracebacks of internal errors"
RUN_HELP = "run id (default: the newest run)"


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "json": "print the facts and verdicts as JSON",
    "bandwidth": "also measure each link's throughput (about 1 s per link)",
    "timeout": "SSH connect timeout per host in seconds: what a dead host costs", "debug": DEBUG_HELP,
})
@guarded
def check_network(c, hosts="", inventory="", json=False, bandwidth=False, timeout=DEFAULT_CONNECT_TIMEOUT_S, debug=False):
    """Pre-flight check: SSH, versions, GPUs, overlay, all-to-all ports, MTU, and a gloo all-reduce."""
    from deploy.commands.check import CheckRequest, main

    _exit(main(CheckRequest(inventory or None, hosts or None, bool(json), bool(bandwidth), float(timeout)), ROOT))


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "yes": "trust new keys without asking (check the fingerprints!)",
    "timeout": "connect timeout per host in seconds", "debug": DEBUG_HELP,
})
@guarded
def trust(c, hosts="", inventory="", yes=False, timeout=DEFAULT_CONNECT_TIMEOUT_S, debug=False):
    """Show each host's SSH key fingerprint and add new keys to the inventory's known_hosts (asks first)."""
    from deploy.commands.trust import TrustRequest, main

    main(TrustRequest(inventory or None, hosts or None, bool(yes), float(timeout)))


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "base": "interpreter on the host that creates the venv (default python3)",
            "reuse_site": "let the venv also see this interpreter's packages (e.g. a shared env with torch)",
            "debug": DEBUG_HELP})
@guarded
def setup(c, hosts="", inventory="", base="python3", reuse_site="", debug=False):
    """Prepare each host's Python: <workdir>/.venv with this project installed (idempotent)."""
    from deploy.commands.setup import main

    main(inventory or None, hosts or None, base, reuse_site or None, ROOT)


@task(help={"hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "data": "also a dataset: SRC:DEST (local dir : dir on each host, relative to its workdir or absolute)",
            "debug": DEBUG_HELP})
@guarded
def sync(c, hosts="", inventory="", data="", debug=False):
    """Copy the project's code (git-tracked and untracked-not-ignored files), and --data, to each host."""
    from deploy.commands.sync import main

    main(inventory or None, hosts or None, data or None, ROOT)


@task(help={
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
    "config": "trainer config YAML (default train/configs/digits.yaml)",
    "script": "run this torchrun-compatible script instead of the trainer; its arguments go after --",
    "nnodes": "elastic bounds MIN:MAX (default: the inventory's `elastic`, else fixed)",
    "timeout": "process-group timeout in seconds: how long a lost peer may stall a collective",
    "detach": "start the run and return its id", "skip_checks": "skip the pre-flight checks",
    "no_sync": "do not sync the code first", "debug": DEBUG_HELP,
    "resume": "continue an earlier run (its id) from its newest checkpoint, on its hosts by default",
    "comm": "gradient communication: none|fp16|bf16|powersgd|localsgd|diloco|diloco-overlap, or auto (measure "
            "bandwidth and RTT, pick by the floor)",
    "firewall": "fab firewall up on the hosts for the run's duration (down afterwards, whatever happens)",
})
@guarded
def train(c, hosts="", inventory="", config="", script="", nnodes="", timeout=DEFAULT_PG_TIMEOUT_S,
          detach=False, skip_checks=False, no_sync=False, resume="", comm="", firewall=False, debug=False):
    """Train on the selected hosts: one synchronized torchrun per host, live logs, summary."""
    from deploy.commands.train import TrainRequest, main
    from deploy.run.plan import Workload

    workload = Workload(script=script or None, config=config or None, args=remainder())
    request = TrainRequest(inventory or None, hosts or None, workload, nnodes or None, int(timeout),
                           detach, skip_checks, no_sync, resume or None, comm or None)
    if not firewall:
        _exit(main(request, ROOT))
        return
    from deploy.commands.firewall import around_run

    _exit(around_run(request.inventory, request.hosts, request.detach, lambda: main(request, ROOT), ROOT))


@task(help={"run": "run id (default: every recorded run that may still be running)", "json": "print JSON for scripts",
            "debug": DEBUG_HELP})
@guarded
def status(c, run="", json=False, debug=False):
    """Runs, hosts, state, epoch/step and uptime, read from the hosts."""
    from deploy.commands.status import main

    main(run or None, bool(json), ROOT)


@task(help={"run": RUN_HELP, "follow": "keep printing new lines until Ctrl-C", "lines": "lines per host",
            "debug": DEBUG_HELP})
@guarded
def logs(c, run="", follow=False, lines=50, debug=False):
    """Show a run's logs from every host, prefixed [host:rank]."""
    from deploy.commands.logs import main

    main(run or None, bool(follow), int(lines), ROOT)


@task(help={"run": RUN_HELP, "debug": DEBUG_HELP})
@guarded
def stop(c, run="", debug=False):
    """Stop a run on every host (TERM, grace, KILL) and confirm no run process is left."""
    from deploy.commands.stop import main

    _exit(main(run or None, ROOT))


@task(help={"run": "the elastic run's id", "hosts": "hosts to add", "debug": DEBUG_HELP})
@guarded
def join(c, run="", hosts="", debug=False):
    """Add hosts to a running elastic run: same rendezvous, the world grows."""
    from deploy.commands.membership import main

    main("join", run, hosts, ROOT)


@task(help={"run": "the elastic run's id", "hosts": "hosts to remove", "debug": DEBUG_HELP})
@guarded
def leave(c, run="", hosts="", debug=False):
    """Remove hosts from a running elastic run gracefully; it goes on while its minimum holds."""
    from deploy.commands.membership import main

    main("leave", run, hosts, ROOT)


@task(name="fetch-checkpoints", help={
    "run": RUN_HELP, "dest": "where runs live locally (default runs/)",
    "force": "overwrite local files that differ from the hosts' copies", "debug": DEBUG_HELP})
@guarded
def fetch_checkpoints(c, run="", dest="runs", force=False, debug=False):
    """Bring a run home: verified checkpoints + manifest, and every host's logs and metrics."""
    from deploy.commands.fetch import main

    _exit(main(run or None, dest, bool(force), ROOT))


@task(help={"run": RUN_HELP, "json": "print JSON for scripts", "debug": DEBUG_HELP})
@guarded
def report(c, run="", json=False, debug=False):
    """Throughput per host and rank, step-time breakdown, final and best accuracy, and a PNG of the curves."""
    from deploy.commands.report import main

    main(run or None, bool(json), ROOT)


# `action` defaults to None: invoke fills a positional argument only while its value is still None.
@task(positional=["action"], help={"action": "up | down | status (default status)", "hosts": HOSTS_HELP,
                                   "inventory": INVENTORY_HELP, "debug": DEBUG_HELP})
@guarded
def firewall(c, action=None, hosts="", inventory="", debug=False):
    """Each host's own iptables: allow SSH and the member hosts on the training interface, refuse other TCP."""
    from deploy.commands.firewall import FirewallRequest, main

    _exit(main(FirewallRequest(action or "status", inventory or None, hosts or None), ROOT))
