"""What a finished run left in the controller's runs/: its summary, logs and epoch records, and
which simulated host a process belongs to (shared by the elastic and multi-host tests); and the
elastic tests' short run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fabrun import ROOT, fab

# Small steps so a kill lands mid-epoch; a checkpoint every 5 steps bounds what is redone.
ELASTIC_TRAIN = ["epochs=12", "checkpoint.every_steps=5", "data.batch_size=16"]


def logs_of(run_id: str, tail: int = 3000) -> str:
    """The end of each host's run log, for a failure's message."""
    return "".join(f"\n--- {path.name} ---\n{path.read_text(errors='replace')[-tail:]}"
                   for path in sorted((ROOT / "runs" / run_id / "logs").glob("*.log")))


def summary_of(run_id: str) -> dict:
    return json.loads((ROOT / "runs" / run_id / "summary.json").read_text())


def on_host(pid: int, host: str) -> bool:
    """Whether process `pid` belongs to simulated host `host` (its MESHRUN_HOST). Both test-bed
    slots name their hosts h1, h2, ...: pass only pids of one run (`run_processes(run_id)`)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"MESHRUN_HOST={host}".encode() in env


def all_epoch_records(run_id: str) -> list[dict]:
    """Epoch records from every fetched host (rank 0 moves when the rendezvous host is lost); for an
    epoch written twice (a resume redid it), the one written last."""
    by_epoch: dict[int, dict] = {}
    for path in sorted((ROOT / "runs" / run_id / "hosts").glob("*/metrics.jsonl")):
        for record in map(json.loads, path.read_text().splitlines()):
            if record.get("kind") == "epoch" and record["time"] >= by_epoch.get(record["epoch"], {}).get("time", 0):
                by_epoch[record["epoch"]] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def assert_whole_epochs(run_id: str, epochs: int = 12) -> list[dict]:
    """Finished every epoch, ≥ 95 %, and every sample of every epoch used exactly once."""
    assert fab("fetch-checkpoints", "--run", run_id).returncode == 0
    records = all_epoch_records(run_id)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    per_epoch = records[0]["samples_seen"]
    assert [r["samples_seen"] for r in records] == [per_epoch * (i + 1) for i in range(epochs)]
    assert records[-1]["test_acc"] >= 0.95
    return records
