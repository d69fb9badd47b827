"""`runs/<run_id>/summary.json`: the user contract scripts read. Keys are only ever added."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from meshrun.deploy.run.outcome import JobOutcome
from meshrun.deploy.run.membership import OUTLIVED_DETAIL, Change, MembershipEvent
from meshrun.deploy.run.plan import LaunchPlan
from meshrun.deploy.run.answers import from_json, is_int, is_real

COUNTS = ("world_size", "restarts", "epochs_completed")  # result.json's counts (train/metrics.py)
MAX_METRICS = 100  # of a result.json: the trainer writes a handful
STARTS_READ_MAX = 64 << 10  # of a host's starts.json: one short entry per attempt of the run


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    status: str  # succeeded | failed | stopped
    hosts: list[str]
    world_size: int
    restarts: int  # starts of the worker group after the first (`restarts_of`)
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


def starts_key(rdzv_id: str, host: str | None) -> str:
    """A host's key in starts.json for the launch: a --script run's runner (deploy/host/runscript.py) counts
    under `<rdzv id>@<host>`, as hosts sharing a workdir share the file; the trainer's host leaders
    (train/starts.py, `host` None) under the rdzv id alone, as they write the count the group agreed."""
    return rdzv_id if host is None else f"{rdzv_id}@{host}"


def host_starts(text: str, rdzv_id: str, host: str | None) -> int | None:
    """`host`'s count of the launch's worker-group starts, from its starts.json as it answered, under its
    `starts_key` only (another host sharing the workdir counts under its own; `host` None: the trainer's
    key); None unless a whole JSON object (not cut at STARTS_READ_MAX) holds a whole number >= 1 there.
    The host wrote it, so it is data: how large it may be is `restarts_of`'s to judge."""
    if len(text) > STARTS_READ_MAX:
        return None
    raw = from_json(text)
    value = raw.get(starts_key(rdzv_id, host)) if isinstance(raw, dict) else None
    return value if is_int(value) and value >= 1 else None


def max_restarts(plan: LaunchPlan) -> int:
    """torchrun's `--max-restarts` as the plan starts it (its first one: a script's own arguments follow)."""
    found = [argv[argv.index("--max-restarts") + 1] for argv in (h.torchrun for h in plan.hosts)
             if "--max-restarts" in argv[:-1]]
    return max((int(n) for n in found if n.isascii() and n.isdigit()), default=0)


def starts_cap(plan: LaunchPlan, events: tuple[MembershipEvent, ...]) -> int:
    """The most starts the timeline allows the worker group: the first; one per change of membership in
    an elastic run (a fixed run's first change ends it); and every torchrun's own budget of failure
    restarts, `--max-restarts` each: each host's torchrun has its own, and a host that joins, or comes
    back, and every succession generation start fresh ones. A bound, not a count: generous, so an
    honest count is never past it, and what a lying host can add is bounded by the run itself."""
    changes = [e for e in events if e.event in (Change.JOINED, Change.LEFT, Change.LOST, Change.SUCCESSION)]
    torchruns = sum(e.event in (Change.STARTED, Change.JOINED) for e in events)
    torchruns = max(torchruns, len(plan.hosts)) * (1 + sum(e.event is Change.SUCCESSION for e in events))
    return 1 + (len(changes) if plan.elastic is not None else 0) + torchruns * max_restarts(plan)


def seen_restarts(plan: LaunchPlan, events: tuple[MembershipEvent, ...]) -> int:
    """The restarts the controller's timeline shows, when no host told its count: in an elastic run,
    each host admitted while training went on (joined, and not stopped as outlived) and each host lost
    or gone while at least MIN kept running and training was not over. An estimate: changes too close
    together restart the group once, and torchrun's restarts of failed workers are not in the timeline."""
    if plan.elastic is None:
        return 0
    outlived = {e.host for e in events if e.event is Change.FINISHED and e.detail == OUTLIVED_DETAIL}
    running: set[str] = set()
    over, count = False, 0
    for e in events:
        if e.event is Change.FINISHED:
            over = True
            running.discard(e.host)
        elif e.event in (Change.STARTED, Change.JOINED):
            count += e.event is Change.JOINED and bool(running) and not over and e.host not in outlived
            running.add(e.host)
        elif e.event in (Change.LOST, Change.LEFT) and e.host in running:
            running.discard(e.host)
            count += not over and len(running) >= plan.elastic.min
    return count


def restarts_of(plan: LaunchPlan, outcome: JobOutcome, result: Mapping[str, Any], starts: Iterable[int]) -> int:
    """summary.json's `restarts`: the trainer's own count (result.json, agreed across its ranks); else
    the hosts' start counts (`starts`, of the hosts that answered): the largest, as a host that joined
    late saw fewer starts; exact when a host that ran from the launch to the end answered, fewer
    otherwise. A compromised host may say anything of its own count: one past `starts_cap` is no
    honest count and is left out; only when every count is past it does the cap stand for them.
    Without any count, what the timeline shows (`seen_restarts`), never a bare 0."""
    if "restarts" in result:
        return int(result["restarts"])
    counts = [n for n in starts if is_int(n) and n >= 1]
    if not counts:
        return seen_restarts(plan, outcome.events)
    cap = starts_cap(plan, outcome.events)
    return max((n for n in counts if n <= cap), default=cap) - 1


def build_summary(plan: LaunchPlan, outcome: JobOutcome, result: Mapping[str, Any] | None,
                  comm: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None,
                  starts: Iterable[int] = ()) -> RunSummary:
    """Combine what the controller saw with what the trainer reported (result.json), if any, and the
    hosts' counts of the worker group's starts (`starts`, read after the run: a --script run's, or a
    trainer run's that wrote no result.json: it failed or was stopped)."""
    result = result or {}
    return RunSummary(
        run_id=plan.run_id,
        status=outcome.status.value,
        hosts=[h.host.name for h in plan.hosts],
        world_size=int(result.get("world_size", _last_world_size(plan, outcome))),
        restarts=restarts_of(plan, outcome, result, starts),
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
