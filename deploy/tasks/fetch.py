from __future__ import annotations

from pathlib import Path

from fabric import task
from invoke.exceptions import Exit

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, ROOT, RUN_HELP


@task(name="fetch-checkpoints", help={
    "run": RUN_HELP, "dest": "where runs live locally (default runs/)",
    "force": "overwrite local files that differ from the hosts' copies", "debug": DEBUG_HELP})
@guarded
def fetch_checkpoints(c, run="", dest="runs", force=False, debug=False):
    """Bring a run home: verified checkpoints + manifest, and every host's logs and metrics."""
    from deploy.commands.fetch import fetch_run
    from deploy.runs import resolve_run

    record = resolve_run(ROOT, run or None)
    renderer = Renderer()
    destination = Path(dest) if Path(dest).is_absolute() else ROOT / dest
    reports = fetch_run(record, ROOT, destination, force, renderer)
    renderer.fetch_reports(record.run_id, str(destination / record.run_id), reports)
    corrupt = [f"{r.host}:{name}" for r in reports for name in r.corrupt]
    if corrupt:
        renderer.error(f"checksum mismatch, not kept: {', '.join(corrupt)}; the host's copy is damaged")
        raise Exit(code=1)
