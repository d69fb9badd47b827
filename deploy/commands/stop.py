"""`fab stop`: TERM, grace, KILL on every host of a run, and proof that nothing is left."""

from __future__ import annotations


from meshrun.deploy.edges.agents import stop_run
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import resolve_run
from meshrun.deploy.render.console import Renderer


def main(run: str | None, project: Project) -> int:
    """Exit status 1 when a host could not be reached or still has run processes."""
    renderer = Renderer()
    record = resolve_run(project.runs, run, live_only=True, warn=renderer.warn)
    dirty = []
    results = stop_run(record, project.root)
    for host in results:
        if host in results.failed:
            dirty.append(host)
            renderer.error(f"{host}: {results.failed[host]}")
        elif left := results.ok[host]:
            dirty.append(host)
            renderer.error(f"{host}: processes still alive: {list(left)}")
        else:
            renderer.info(f"{host}: clean, no process of run {record.run_id} left")
    if dirty:
        return 1
    renderer.info(f"run {record.run_id} stopped on {len(record.hosts)} host(s)")
    return 0
