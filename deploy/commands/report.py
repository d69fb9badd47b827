"""`fab report`: a run's throughput per host and rank, step-time breakdown, accuracy, and a PNG."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from common.layout import run_dir
from deploy.edges.comm import beside_floor, load_plan
from deploy.edges.records import resolve_run
from deploy.errors import InputError
from deploy.render.console import Renderer

from deploy.render.png import write_png
from deploy.run.report import RunReport, load_report


def metrics_root(root: Path, run_id: str) -> Path:
    """Where a run's metrics are: per host after `fab fetch-checkpoints`, else in the run dir itself."""
    home = root / run_dir(run_id)
    fetched = home / "hosts"
    if fetched.is_dir() and any(fetched.glob("*/metrics*.jsonl")):
        return fetched
    if any(home.glob("metrics*.jsonl")):
        return home
    raise InputError(f"run {run_id}: no metrics under {home}; bring them home first: "
                     f"fab fetch-checkpoints --run {run_id}")


def build_report(root: Path, run_id: str) -> tuple[RunReport, Path]:
    """The report and the PNG written next to the run (`runs/<id>/report.png`)."""
    report = load_report(metrics_root(root, run_id))
    png = write_png(report, root / run_dir(run_id) / "report.png")
    return report, png


def comm_beside_floor(root: Path, run_id: str, report: RunReport) -> dict | None:
    """With `fab train --comm`: rank 0's measured all-reduce per step beside the ring floor."""
    saved = load_plan(root, run_id)
    if saved is None:
        return None
    measured = next((r.comm_s for r in report.ranks if r.rank == 0), None)
    return beside_floor(saved, measured)


def report_json(run_id: str, report: RunReport, png: Path, comm: dict | None = None) -> dict:
    return {"comm": comm, "run_id": run_id, "png": str(png), "final_test_acc": report.final_test_acc,
            "best_test_acc": report.best_test_acc, "total_samples_per_s": report.total_samples_per_s,
            "resumes": report.resumes, "ranks": [asdict(r) for r in report.ranks],
            "epochs": [asdict(e) for e in report.epochs]}


def main(run: str | None, as_json: bool, root: Path) -> None:
    """`fab report [--run ID] [--json]`."""
    run_id = resolve_run(root, run).run_id
    result, png = build_report(root, run_id)
    comm = comm_beside_floor(root, run_id, result)
    renderer = Renderer()
    if as_json:
        renderer.json(report_json(run_id, result, png, comm))
    else:
        renderer.run_report(run_id, result, str(png), comm)
