from __future__ import annotations

from fabric import task

from deploy.cli import guarded
from deploy.render import Renderer
from deploy.tasks import DEBUG_HELP, ROOT, RUN_HELP


@task(help={"run": RUN_HELP, "json": "print JSON for scripts", "debug": DEBUG_HELP})
@guarded
def report(c, run="", json=False, debug=False):
    """Throughput per host and rank, step-time breakdown, final and best accuracy, and a PNG of the curves."""
    from deploy.commands.report import build_report, comm_beside_floor, report_json
    from deploy.runs import resolve_run

    run_id = resolve_run(ROOT, run or None).run_id
    result, png = build_report(ROOT, run_id)
    comm = comm_beside_floor(ROOT, run_id, result)
    renderer = Renderer()
    if json:
        renderer.json(report_json(run_id, result, png, comm))
    else:
        renderer.run_report(run_id, result, str(png), comm)
