"""`fab status`: runs, hosts, state, epoch/step and uptime, read from the hosts' agents."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from deploy.edges.agents import host_states
from deploy.edges.records import live_records, load_record
from deploy.render.console import Renderer


def main(run: str | None, as_json: bool, root: Path) -> None:
    """A named run, else every recorded run that may still be running: finished and stale runs
    are not asked about, so their hosts (perhaps long gone) are never contacted."""
    records = [load_record(root, run)] if run else live_records(root)
    states = [state for record in records for state in host_states(record, root)]
    renderer = Renderer()
    if as_json:
        renderer.json([asdict(s) for s in states])
    elif not records:
        renderer.info("no run may still be running; name an older one with --run ID")
    else:
        renderer.run_states(states)
