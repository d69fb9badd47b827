"""`fab status`: runs, hosts, state, epoch/step and uptime, read from the hosts' agents."""

from __future__ import annotations

from dataclasses import asdict

from meshrun.deploy.edges.agents import host_states
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import live_records, load_record
from meshrun.deploy.render.console import Renderer


def main(run: str | None, as_json: bool, project: Project) -> None:
    """A named run, else every recorded run that may still be running: finished and stale runs
    are not asked about, so their hosts (perhaps long gone) are never contacted."""
    records = [load_record(project.runs, run)] if run else live_records(project.runs)
    states = [state for record in records for state in host_states(record, project.root)]
    renderer = Renderer()
    if as_json:
        renderer.json([asdict(s) for s in states])
    elif not records:
        renderer.info("no run may still be running; name an older one with --run ID")
    else:
        renderer.run_states(states)
