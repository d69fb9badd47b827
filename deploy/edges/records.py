"""The controller's record of each run: `runs/<run_id>/launch.json`, so later tasks
(`fab status`, `logs`, `stop`, `fetch-checkpoints`, `join`) know where a run lives."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from meshrun.fsutil import atomic_write_bytes, atomic_write_json
from meshrun.layout import DEFAULT_PG_TIMEOUT_S, HEARTBEAT_TIMEOUT_S, is_run_id, LAUNCH_RECORD, SUMMARY
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.run.summary import RunSummary


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    inventory: str  # absolute path of the inventory used
    hosts: tuple[str, ...]
    started: float
    detached: bool
    rdzv_endpoint: str
    rdzv_id: str = ""
    elastic: tuple[int, int] | None = None  # (min, max) for elastic runs
    workload: dict = field(default_factory=dict)  # plan.Workload fields: script, config, args
    pg_timeout_s: int = DEFAULT_PG_TIMEOUT_S
    controller_pid: int | None = None  # the attached `fab train` that watches this run
    firewall: bool = False  # started with --firewall: a joining host is let in by the members' chains

    def save(self, runs: Path) -> Path:
        path = runs / self.run_id / LAUNCH_RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, asdict(self))
        return path


def load_record(runs: Path, run_id: str) -> RunRecord:
    if not is_run_id(run_id):
        raise InputError(f"--run {shown(run_id)}: not a run id (letters, digits, '.', '_', '-'; no '..'); "
                         "list runs with `fab status`")
    path = runs / run_id / LAUNCH_RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"run '{run_id}': no {path}; list runs with `fab status`") from None
    except ValueError as err:
        raise InputError(f"{path}: unreadable ({err}); the run record is damaged") from None
    elastic = data.get("elastic")
    return RunRecord(data["run_id"], data["inventory"], tuple(data["hosts"]), data["started"], data["detached"],
                     data["rdzv_endpoint"], data.get("rdzv_id", data["run_id"]),
                     tuple(elastic) if elastic else None, data.get("workload", {}), data.get("pg_timeout_s", DEFAULT_PG_TIMEOUT_S),
                     data.get("controller_pid"), data.get("firewall") is True)


def all_records(runs: Path) -> list[RunRecord]:
    """Every recorded run, newest first."""
    found = sorted(runs.glob(f"*/{LAUNCH_RECORD}"), reverse=True)
    return [load_record(runs, p.parent.name) for p in found]


def resolve_run(runs: Path, run_id: str | None, live_only: bool = False) -> RunRecord:
    """The named run, else the newest one (with `live_only`, the newest that may still be running:
    a task never contacts the hosts of a finished or stale run unless the user names it)."""
    if run_id:
        return load_record(runs, run_id)
    records = live_records(runs) if live_only else all_records(runs)
    if not records:
        if live_only and all_records(runs):
            raise InputError("no recorded run may still be running; name one with --run ID "
                             "(the newest is " + all_records(runs)[0].run_id + ")")
        raise InputError("no runs recorded under runs/; start one with `fab train`")
    return records[0]


def controller_alive(record: RunRecord) -> bool:
    """The run's attached controller still runs (its pid is a `fab train` or `meshrun train` process)."""
    if record.detached or not record.controller_pid:
        return False
    try:
        cmdline = Path(f"/proc/{record.controller_pid}/cmdline").read_bytes()
    except OSError:
        return False
    return (b"fab" in cmdline or b"meshrun" in cmdline) and b"train" in cmdline


def may_be_running(record: RunRecord, has_summary: bool, attached_controller_alive: bool, now: float) -> bool:
    """Pure rule: a run with a summary has ended; an attached run whose controller is gone ended
    too once its agents missed heartbeats for HEARTBEAT_TIMEOUT_S; a detached run may run on."""
    if has_summary:
        return False
    if record.detached:
        return True
    return attached_controller_alive or now - record.started < HEARTBEAT_TIMEOUT_S + 5


def live_records(runs: Path) -> list[RunRecord]:
    """Recorded runs that may still be running, newest first."""
    now = time.time()
    return [r for r in all_records(runs)
            if may_be_running(r, (runs / r.run_id / SUMMARY).exists(), controller_alive(r), now)]


def new_run_id() -> str:
    """Sortable and unique: reusing an rdzv id would join a stale rendezvous."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def write_summary(run_path: Path, summary: RunSummary) -> Path:
    """`runs/<run_id>/summary.json`, atomically: scripts polling for it never read half of it."""
    run_path.mkdir(parents=True, exist_ok=True)
    path = run_path / SUMMARY
    atomic_write_bytes(path, (summary.to_json() + "\n").encode())
    return path
