"""`fab report`: how a run ended, its throughput per host and rank, step-time breakdown, accuracy, and a PNG.

A `--script` run records no per-step metrics, so its report is what the run did record: its
outcome, hosts and timeline (summary.json) and what produced it (its provenance); only a run with
none of those is refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from meshrun.layout import HOSTS, SUMMARY, TRAIN_LOG
from meshrun.deploy.edges.comm import beside_floor, load_plan
from meshrun.deploy.edges.provenance import detached as detached_provenance
from meshrun.deploy.inputfiles import RECORD_MAX, read_optional
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.edges.watch import tail
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown_path, with_path
from meshrun.deploy.render.console import Renderer

from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.alone import ALONE_MAX, ALONE_READ, AloneRank, alone_warning, trained_alone
from meshrun.deploy.run.answers import from_json, is_int, is_real, said
from meshrun.deploy.run.provenance import report_lines
from meshrun.deploy.run.report import RunReport, load_report


NO_METRICS = ("a --script run records no per-step metrics (only the built-in trainer writes metrics.jsonl): "
              "no throughput table or plot")
STATUSES = ("succeeded", "failed", "stopped")
TIMELINE_SHOWN = 64  # events: an elastic run's joins and losses; the rest are in summary.json


def find_metrics(runs: Path, run_id: str) -> Path | None:
    """Where a run's metrics are: per host after `fab fetch-checkpoints`, else in the run dir itself."""
    home = runs / run_id
    fetched = home / "hosts"
    if fetched.is_dir() and any(fetched.glob("*/metrics*.jsonl")):
        return fetched
    return home if any(home.glob("metrics*.jsonl")) else None


def metrics_root(runs: Path, run_id: str, script: str | None = None) -> Path:
    """`find_metrics`, or why there are none. `script`: the run's --script (its launch record), whose
    runs write none."""
    home = runs / run_id
    found = find_metrics(runs, run_id)
    if found is not None:
        return found
    if script is not None:
        raise InputError(f"run {run_id}: no metrics under {home}: it ran --script {shown_path(script)}, and runs of "
                         "a user script record no metrics (only the built-in trainer writes metrics.jsonl)")
    raise InputError(f"run {run_id}: no metrics under {home}; bring them home first: "
                     f"fab fetch-checkpoints --run {run_id}")


def build_report(runs: Path, run_id: str, script: str | None = None,
                 warn: Callable[[str], None] = print) -> tuple[RunReport, Path | None]:
    """The report and the PNG written next to the run (`runs/<id>/report.png`). `report` only reads
    otherwise: a run folder it cannot write in (a colleague's runs, read-only media) costs the picture,
    said in one `warn` line, never the table (the PNG is None then)."""
    report = load_report(metrics_root(runs, run_id, script))
    path = runs / run_id / "report.png"
    try:
        return report, write_png(report, path)
    except OSError as err:
        reason = os.strerror(err.errno).lower() if err.errno else type(err).__name__
        warn(with_path("plot not written: ", path, f": {reason}; the table below is complete"))
        return report, None


def comm_beside_floor(runs: Path, run_id: str, report: RunReport) -> dict | None:
    """With `fab train --comm`: rank 0's measured all-reduce per step beside the ring floor."""
    saved = load_plan(runs, run_id)
    if saved is None:
        return None
    measured = next((r.comm_s for r in report.ranks if r.rank == 0), None)
    return beside_floor(saved, measured)


def read_summary(runs: Path, run_id: str) -> dict | None:
    """summary.json as a JSON object; None before the run ends, or for a detached run (it gets none)."""
    data = read_optional(runs / run_id / SUMMARY, RECORD_MAX, "run summary",
                         "the file is damaged or was edited; remove it")
    found = from_json(data.decode("utf-8", "replace")) if data is not None else None
    return found if isinstance(found, dict) else None


def summary_provenance(runs: Path, run_id: str) -> dict | None:
    """summary.json's `provenance` (None before the run ends, for a detached run (its provenance.json,
    deploy/edges/provenance.detached), or an older run)."""
    provenance = (read_summary(runs, run_id) or {}).get("provenance")
    return provenance if isinstance(provenance, dict) else None


def _shown(value: object) -> str:
    return said(str(value), 80) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "?"


@dataclass(frozen=True)
class ScriptOutcome:
    """What a --script run's summary.json says of its outcome, each field read with its type checked
    (the file could have been edited: a wrong one is None or left out)."""

    recorded: bool  # summary.json is there (a detached run, or one not ended, has none)
    status: str | None = None  # one of STATUSES
    world_size: int | None = None
    restarts: int | None = None
    duration_s: float | None = None
    started: float | None = None
    failed_host: str | None = None
    reason: str | None = None
    exits: dict[str, int | None] = field(default_factory=dict)  # host -> exit status; None: lost
    timeline: list[dict] = field(default_factory=list)  # events with a numeric time, an event and a host
    trained_alone: list[dict] = field(default_factory=list)  # {host, rank, world_size}: deploy/run/alone.py


def script_outcome(summary: dict | None) -> ScriptOutcome:
    if summary is None:
        return ScriptOutcome(False)
    got: dict = summary
    ints = {k: got[k] for k in ("world_size", "restarts") if is_int(got.get(k))}
    reals = {k: float(got[k]) for k in ("duration_s", "started") if is_real(got.get(k))}
    texts = {k: got[k] for k in ("failed_host", "reason") if isinstance(got.get(k), str)}
    results = got.get("host_results") if isinstance(got.get("host_results"), dict) else {}
    exits = {str(h): (r["rc"] if isinstance(r, dict) and is_int(r.get("rc")) else None) for h, r in results.items()}
    events = got.get("timeline") if isinstance(got.get("timeline"), list) else []
    timeline = [e for e in events if isinstance(e, dict) and is_real(e.get("time"))
                and isinstance(e.get("event"), str) and isinstance(e.get("host"), str)]
    status = got.get("status") if got.get("status") in STATUSES else None
    return ScriptOutcome(True, status, **ints, **reals, **texts, exits=exits, timeline=timeline,
                         trained_alone=alone_entries(got.get("trained_alone")))


def alone_entries(listed: object) -> list[dict]:
    """summary.json's `trained_alone`, the entries of the shape the controller writes only."""
    entries = listed[:ALONE_MAX] if isinstance(listed, list) else []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("host"), str) and is_int(e.get("rank"))
            and is_int(e.get("world_size")) and 0 <= e["rank"] < e["world_size"]]


def logged_alone(home: Path, hosts: Iterable[str]) -> list[AloneRank]:
    """A run without summary.json (detached): the ranks that trained alone, as the ends of its hosts'
    agent logs here say (`hosts/<host>/hosts/<host>/train.log` as `fab fetch-checkpoints` brought it
    from the host's run directory; `hosts/<host>/train.log` where the run lives here, a local host).
    Each log counts for its own host only (deploy/run/alone.py), whatever else it holds."""
    return trained_alone({host: tail(home / HOSTS / host / HOSTS / host / TRAIN_LOG, ALONE_READ) + "\n"
                          + tail(home / HOSTS / host / TRAIN_LOG, ALONE_READ) for host in hosts})


def script_run_lines(run_id: str, script: str, outcome: ScriptOutcome, hosts: tuple[str, ...]) -> list[str]:
    """`fab report`'s lines for a --script run, before its provenance's: outcome, hosts, timeline."""
    head = f"run {run_id}: ran --script {shown_path(script)}"
    alone = alone_warning(AloneRank(_shown(e["host"]), e["rank"], e["world_size"]) for e in outcome.trained_alone)
    if not outcome.recorded:
        return [f"{head}; no summary.json (detached, or not ended yet): fab status --run {run_id}",
                f"hosts: {', '.join(hosts)}"] + ([f"from the hosts' logs here: {alone}"] if alone else [])
    facts = [outcome.status or "status unknown"]
    facts += [f"world size {outcome.world_size}"] if outcome.world_size is not None else []
    facts += [f"restarts {outcome.restarts}"] if outcome.restarts is not None else []
    facts += [f"{outcome.duration_s:.1f} s"] if outcome.duration_s is not None else []
    facts += [f"failed on {_shown(outcome.failed_host)}"] if outcome.failed_host is not None else []
    facts += [f"reason: {_shown(outcome.reason)}"] if outcome.reason is not None else []
    exits = ", ".join(f"{_shown(host)} ({'lost' if rc is None else f'exit {rc}'})"
                      for host, rc in outcome.exits.items())
    lines = [f"{head}; {', '.join(facts)}", f"hosts: {exits or ', '.join(hosts)}"]
    for event in outcome.timeline[:TIMELINE_SHOWN]:
        at = f"+{event['time'] - outcome.started:.1f} s" if outcome.started is not None else f"{event['time']:.0f}"
        size = f" (world size {event['world_size']})" if is_int(event.get("world_size")) else ""
        lines.append(f"timeline {at}: {_shown(event['event'])} {_shown(event['host'])}{size}")
    if len(outcome.timeline) > TIMELINE_SHOWN:
        lines.append(f"timeline: {len(outcome.timeline) - TIMELINE_SHOWN} more event(s) in summary.json")
    return lines + ([alone] if alone else [])


def ended_line(run_id: str, outcome: ScriptOutcome) -> str:
    """How a built-in trainer run ended, as its summary.json says (a script run's is in `script_run_lines`):
    the first line of its report, so that the last epoch of a run stopped at 23 of 200 reads as such."""
    if not outcome.recorded:
        return f"run {run_id}: no summary.json (detached, or not ended): fab status --run {run_id}"
    facts = [outcome.status or "status unknown"]
    facts += [f"failed on {_shown(outcome.failed_host)}"] if outcome.failed_host is not None else []
    facts += [f"reason: {said(outcome.reason)}"] if outcome.reason is not None else []
    return f"run {run_id}: {', '.join(facts)}"


def report_json(run_id: str, report: RunReport, png: Path | None, comm: dict | None = None,
                provenance: dict | None = None, outcome: ScriptOutcome = ScriptOutcome(False)) -> dict:
    """`--json`: `status` and `reason` are summary.json's (null without one: detached, or not ended)."""
    return {"comm": comm, "provenance": provenance, "run_id": run_id, "png": str(png) if png is not None else None,
            "status": outcome.status, "reason": outcome.reason,
            "final_test_acc": report.final_test_acc,
            "best_test_acc": report.best_test_acc, "total_samples_per_s": report.total_samples_per_s,
            "resumes": report.resumes, "ranks": [asdict(r) for r in report.ranks],
            "epochs": [asdict(e) for e in report.epochs], "skipped": list(report.skipped)}


def script_report(runs: Path, record: RunRecord, script: str, as_json: bool) -> None:
    """A --script run: what it recorded, and NO_METRICS; refused (metrics_root's line) only when it
    recorded neither an outcome nor a provenance, nor brought home any file of the script's own."""
    run_id = record.run_id
    summary = read_summary(runs, run_id)
    provenance = summary_provenance(runs, run_id) or detached_provenance(runs, run_id, load_plan(runs, run_id))
    if summary is None and provenance is None:
        metrics_root(runs, run_id, script)  # raises unless fetched files are there: then its hosts show
    outcome = script_outcome(summary)
    if summary is None:
        outcome = dataclasses.replace(outcome, trained_alone=[asdict(r) for r in logged_alone(runs / run_id,
                                                                                               record.hosts)])
    renderer = Renderer()
    if as_json:
        renderer.json({"run_id": run_id, "script": script, "hosts": list(record.hosts), **asdict(outcome),
                       "provenance": provenance, "comm": None, "png": None, "ranks": [], "epochs": [], "skipped": [],
                       "note": NO_METRICS})
        return
    for line in [*script_run_lines(run_id, script, outcome, record.hosts), *report_lines(provenance), NO_METRICS]:
        renderer.info(line)


def main(run: str | None, as_json: bool, project: Project) -> None:
    """`fab report [--run ID] [--json]`."""
    runs = project.runs
    record = resolve_run(runs, run, warn=Renderer().warn)
    run_id = record.run_id
    script = record.workload.get("script")
    if isinstance(script, str):  # never the trainer's records: a script's own metrics.jsonl is not one (stop51 #5)
        script_report(runs, record, script, as_json)
        return
    renderer = Renderer()
    result, png = build_report(runs, run_id, warn=renderer.warn)
    comm = comm_beside_floor(runs, run_id, result)
    provenance = summary_provenance(runs, run_id) or detached_provenance(runs, run_id, load_plan(runs, run_id))
    outcome = script_outcome(read_summary(runs, run_id))  # its outcome fields are any run's, not a script's only
    if as_json:
        renderer.json(report_json(run_id, result, png, comm, provenance, outcome))
        for line in result.skipped:
            renderer.warn(line)
    else:
        renderer.run_report(run_id, result, str(png) if png is not None else "not written", comm,
                            ended_line(run_id, outcome), finished=outcome.status not in ("failed", "stopped"))
        for line in report_lines(provenance):
            renderer.info(line)
