"""`fab status`, `fab logs`, `fab stop`: act on recorded runs (runs/<run_id>/launch.json)."""

from __future__ import annotations

from dataclasses import asdict

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded
from deploy.errors import MeshrunError
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, ROOT, RUN_HELP


@task(help={"run": "run id (default: every recorded run)", "json": "print JSON for scripts", "debug": DEBUG_HELP})
@guarded
def status(c, run="", json=False, debug=False):
    """Runs, hosts, state, epoch/step and uptime, read from the hosts."""
    from deploy.commands.runs import host_states
    from deploy.runs import all_records, load_record

    records = [load_record(ROOT, run)] if run else all_records(ROOT)[:10]
    states = [state for record in records for state in host_states(record, ROOT)]
    renderer = Renderer()
    if json:
        renderer.json([asdict(s) for s in states])
    else:
        renderer.run_states(states)


@task(help={"run": RUN_HELP, "follow": "keep printing new lines until Ctrl-C", "lines": "lines per host",
            "debug": DEBUG_HELP})
@guarded
def logs(c, run="", follow=False, lines=50, debug=False):
    """Show a run's logs from every host, prefixed [host:rank]."""
    from deploy.commands.runs import show_logs
    from deploy.runs import resolve_run

    show_logs(resolve_run(ROOT, run or None), ROOT, Renderer(), follow, int(lines))


@task(help={"run": RUN_HELP, "debug": DEBUG_HELP})
@guarded
def stop(c, run="", debug=False):
    """Stop a run on every host (TERM, grace, KILL) and confirm no run process is left."""
    from deploy.commands.runs import stop_run
    from deploy.runs import resolve_run

    record = resolve_run(ROOT, run or None)
    renderer = Renderer()
    dirty = []
    for host, left in stop_run(record, ROOT).items():
        if isinstance(left, MeshrunError) or left:
            dirty.append(host)
            renderer.error(f"{host}: {left if isinstance(left, MeshrunError) else f'processes still alive: {list(left)}'}")
        else:
            renderer.info(f"{host}: clean, no process of run {record.run_id} left")
    if dirty:
        raise Exit(code=1)
    renderer.info(f"run {record.run_id} stopped on {len(record.hosts)} host(s)")
