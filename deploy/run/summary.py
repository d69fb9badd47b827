"""`runs/<run_id>/summary.json`: the user contract scripts read. Keys are only ever added."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from meshrun.deploy.run.outcome import JobOutcome
from meshrun.deploy.run.membership import Change
from meshrun.deploy.run.plan import LaunchPlan
from meshrun.deploy.run.answers import from_json, is_int, is_real

COUNTS = ("world_size", "restarts", "epochs_completed")  # result.json's counts (train/metrics.py)
MAX_METRICS = 100  # of a result.json: the trainer writes a handful


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    status: str  # succeeded | failed | stopped
    hosts: list[str]
    world_size: int
    restarts: int
    epochs_completed: int
    metrics: dict[str, float]
    duration_s: float
    started: float
    ended: float
    reason: str | None = None
    failed_host: str | None = None
    best_test_acc: float | None = None
    host_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # membership changes, in order
    lost_hosts: list[str] = field(default_factory=list)
    comm: dict[str, Any] | None = None  # with --comm: hook, floor_s, measured_s, ratio (deploy/edges/comm.py)
    provenance: dict[str, Any] | None = None  # what produced the run (deploy/run/provenance.py)
    idle: list[dict[str, Any]] = field(default_factory=list)  # idle warnings: time, host, idle_s, threshold

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _finite(value: object) -> bool:
    return is_real(value)  # 10**400 too: math.isfinite would raise OverflowError on it


def trainer_result(text: str) -> dict[str, Any] | None:
    """The trainer's result.json as a host gave it: its known fields that have the right type, the
    others left out (their defaults stand); None when it is not a JSON object. The host wrote it, so it
    is data: a wrong shape must not cost the run its summary."""
    raw = from_json(text)
    if not isinstance(raw, dict):
        return None
    found: dict[str, Any] = {k: raw[k] for k in COUNTS if is_int(raw.get(k)) and 0 <= raw[k] < 2**31}
    metrics = raw.get("metrics")
    if isinstance(metrics, dict):
        found["metrics"] = {k[:80]: float(v) for k, v in list(metrics.items())[:MAX_METRICS] if _finite(v)}
    if _finite(raw.get("best_test_acc")):
        found["best_test_acc"] = float(raw["best_test_acc"])
    return found


def _last_world_size(plan: LaunchPlan, outcome: JobOutcome) -> int:
    """Without the trainer's result (a --script run, or one that failed): the world size after the last
    change of membership the controller saw (a lost host's `lost`), not the launch's; `finished`
    events count the hosts still running, not the job's size."""
    changes = [e.world_size for e in outcome.events if e.event is not Change.FINISHED]
    return changes[-1] if changes else plan.world_size


def build_summary(plan: LaunchPlan, outcome: JobOutcome, result: Mapping[str, Any] | None,
                  comm: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None) -> RunSummary:
    """Combine what the controller saw with what the trainer reported (result.json), if any."""
    result = result or {}
    return RunSummary(
        run_id=plan.run_id,
        status=outcome.status.value,
        hosts=[h.host.name for h in plan.hosts],
        world_size=int(result.get("world_size", _last_world_size(plan, outcome))),
        restarts=int(result.get("restarts", 0)),
        epochs_completed=int(result.get("epochs_completed", 0)),
        metrics={k: float(v) for k, v in dict(result.get("metrics", {})).items()},
        duration_s=round(outcome.duration_s, 2),
        started=outcome.started,
        ended=outcome.ended,
        reason=outcome.reason,
        failed_host=outcome.failed_host,
        best_test_acc=result.get("best_test_acc"),
        host_results={h.host: {"rc": h.rc, "log": str(h.log), "remaining_pids": list(h.remaining),
                               "stop_error": h.stop_error} for h in outcome.hosts},
        timeline=[{"time": round(e.time, 3), "event": e.event.value, "host": e.host, "world_size": e.world_size,
                   "detail": e.detail} for e in outcome.events],
        lost_hosts=sorted({e.host for e in outcome.events if e.event is Change.LOST}),
        comm=comm,
        provenance=provenance,
    )
