"""`fab report`: a run's throughput per host and rank, step-time breakdown, accuracy, and a PNG."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from meshrun.deploy.edges.comm import beside_floor, load_plan
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import resolve_run
from meshrun.deploy.errors import InputError
from meshrun.deploy.render.console import Renderer

from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.report import RunReport, load_report


def metrics_root(runs: Path, run_id: str) -> Path:
    """Where a run's metrics are: per host after `fab fetch-checkpoints`, else in the run dir itself."""
    home = runs / run_id
    fetched = home / "hosts"
    if fetched.is_dir() and any(fetched.glob("*/metrics*.jsonl")):
        return fetched
    if any(home.glob("metrics*.jsonl")):
        return home
    raise InputError(f"run {run_id}: no metrics under {home}; bring them home first: "
                     f"fab fetch-checkpoints --run {run_id}")


def build_report(runs: Path, run_id: str) -> tuple[RunReport, Path]:
    """The report and the PNG written next to the run (`runs/<id>/report.png`)."""
    report = load_report(metrics_root(runs, run_id))
    png = write_png(report, runs / run_id / "report.png")
    return report, png


def comm_beside_floor(runs: Path, run_id: str, report: RunReport) -> dict | None:
    """With `fab train --comm`: rank 0's measured all-reduce per step beside the ring floor."""
    saved = load_plan(runs, run_id)
    if saved is None:
        return None
    measured = next((r.comm_s for r in report.ranks if r.rank == 0), None)
    return beside_floor(saved, measured)


def report_json(run_id: str, report: RunReport, png: Path, comm: dict | None = None) -> dict:
    return {"comm": comm, "run_id": run_id, "png": str(png), "final_test_acc": report.final_test_acc,
            "best_test_acc": report.best_test_acc, "total_samples_per_s": report.total_samples_per_s,
            "resumes": report.resumes, "ranks": [asdict(r) for r in report.ranks],
            "epochs": [asdict(e) for e in report.epochs], "skipped": list(report.skipped)}


def main(run: str | None, as_json: bool, project: Project) -> None:
    runs = project.runs
    """`fab report [--run ID] [--json]`."""
    run_id = resolve_run(runs, run).run_id
    result, png = build_report(runs, run_id)
    comm = comm_beside_floor(runs, run_id, result)
    renderer = Renderer()
    if as_json:
        renderer.json(report_json(run_id, result, png, comm))
        for line in result.skipped:
            renderer.warn(line)
    else:
        renderer.run_report(run_id, result, str(png), comm)
