"""`fab report`: a run's throughput per host and rank, step-time breakdown, accuracy, and a PNG."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from meshrun.layout import SUMMARY
from meshrun.deploy.edges.comm import beside_floor, load_plan
from meshrun.deploy.edges.provenance import detached as detached_provenance
from meshrun.deploy.inputfiles import RECORD_MAX, read_optional
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import resolve_run
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown_path
from meshrun.deploy.render.console import Renderer

from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.answers import from_json
from meshrun.deploy.run.provenance import report_lines
from meshrun.deploy.run.report import RunReport, load_report


def metrics_root(runs: Path, run_id: str, script: str | None = None) -> Path:
    """Where a run's metrics are: per host after `fab fetch-checkpoints`, else in the run dir itself.
    `script`: the run's --script (its launch record), whose runs write none."""
    home = runs / run_id
    fetched = home / "hosts"
    if fetched.is_dir() and any(fetched.glob("*/metrics*.jsonl")):
        return fetched
    if any(home.glob("metrics*.jsonl")):
        return home
    if script is not None:
        raise InputError(f"run {run_id}: no metrics under {home}: it ran --script {shown_path(script)}, and runs of "
                         "a user script record no metrics (only the built-in trainer writes metrics.jsonl)")
    raise InputError(f"run {run_id}: no metrics under {home}; bring them home first: "
                     f"fab fetch-checkpoints --run {run_id}")


def build_report(runs: Path, run_id: str, script: str | None = None) -> tuple[RunReport, Path]:
    """The report and the PNG written next to the run (`runs/<id>/report.png`)."""
    report = load_report(metrics_root(runs, run_id, script))
    png = write_png(report, runs / run_id / "report.png")
    return report, png


def comm_beside_floor(runs: Path, run_id: str, report: RunReport) -> dict | None:
    """With `fab train --comm`: rank 0's measured all-reduce per step beside the ring floor."""
    saved = load_plan(runs, run_id)
    if saved is None:
        return None
    measured = next((r.comm_s for r in report.ranks if r.rank == 0), None)
    return beside_floor(saved, measured)


def summary_provenance(runs: Path, run_id: str) -> dict | None:
    """summary.json's `provenance` (None before the run ends, for a detached run (its provenance.json,
    deploy/edges/provenance.detached), or an older run)."""
    data = read_optional(runs / run_id / SUMMARY, RECORD_MAX, "run summary",
                         "the file is damaged or was edited; remove it")
    found = from_json(data.decode("utf-8", "replace")) if data is not None else None
    provenance = found.get("provenance") if isinstance(found, dict) else None
    return provenance if isinstance(provenance, dict) else None


def report_json(run_id: str, report: RunReport, png: Path, comm: dict | None = None,
                provenance: dict | None = None) -> dict:
    return {"comm": comm, "provenance": provenance, "run_id": run_id, "png": str(png),
            "final_test_acc": report.final_test_acc,
            "best_test_acc": report.best_test_acc, "total_samples_per_s": report.total_samples_per_s,
            "resumes": report.resumes, "ranks": [asdict(r) for r in report.ranks],
            "epochs": [asdict(e) for e in report.epochs], "skipped": list(report.skipped)}


def main(run: str | None, as_json: bool, project: Project) -> None:
    """`fab report [--run ID] [--json]`."""
    runs = project.runs
    record = resolve_run(runs, run, warn=Renderer().warn)
    run_id = record.run_id
    result, png = build_report(runs, run_id, record.workload.get("script"))
    comm = comm_beside_floor(runs, run_id, result)
    provenance = summary_provenance(runs, run_id) or detached_provenance(runs, run_id, load_plan(runs, run_id))
    renderer = Renderer()
    if as_json:
        renderer.json(report_json(run_id, result, png, comm, provenance))
        for line in result.skipped:
            renderer.warn(line)
    else:
        renderer.run_report(run_id, result, str(png), comm)
        for line in report_lines(provenance):
            renderer.info(line)
