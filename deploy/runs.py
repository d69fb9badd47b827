"""The controller's record of each run: `runs/<run_id>/launch.json`, so later tasks
(`fab status`, `logs`, `stop`, `fetch-checkpoints`, `join`) know where a run lives."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.errors import InputError
from deploy.plan import run_dir


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
    pg_timeout_s: int = 60
    controller_pid: int | None = None  # the attached `fab train` that watches this run

    def save(self, root: Path) -> Path:
        path = root / run_dir(self.run_id) / "launch.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".launch.json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path


def load_record(root: Path, run_id: str) -> RunRecord:
    path = root / run_dir(run_id) / "launch.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"run '{run_id}': no {path}; list runs with `fab status`") from None
    except ValueError as err:
        raise InputError(f"{path}: unreadable ({err}); the run record is damaged") from None
    elastic = data.get("elastic")
    return RunRecord(data["run_id"], data["inventory"], tuple(data["hosts"]), data["started"], data["detached"],
                     data["rdzv_endpoint"], data.get("rdzv_id", data["run_id"]),
                     tuple(elastic) if elastic else None, data.get("workload", {}), data.get("pg_timeout_s", 60),
                     data.get("controller_pid"))


def all_records(root: Path) -> list[RunRecord]:
    """Every recorded run, newest first."""
    runs = sorted((root / "runs").glob("*/launch.json"), reverse=True)
    return [load_record(root, p.parent.name) for p in runs]


def resolve_run(root: Path, run_id: str | None) -> RunRecord:
    """The named run, or the newest one."""
    if run_id:
        return load_record(root, run_id)
    records = all_records(root)
    if not records:
        raise InputError("no runs recorded under runs/; start one with `fab train`")
    return records[0]


def new_run_id() -> str:
    """Sortable and unique: reusing an rdzv id would join a stale rendezvous."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
