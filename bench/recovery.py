"""P6: how long an elastic run (`--nnodes 2:3`, 3 simulated hosts, digits) takes to recover.

Two faults, each in its own run, on a host other than the rendezvous host, mid-epoch:
  kill  SIGKILL every process of h3 (torchrun, workers, its sshd sessions);
  cut   take h3's link down (no TCP reset reaches anyone).
Measured: seconds from the fault until rank 0 logs its first training step after the resume
(step records in metrics.rank0.jsonl, the resume record in metrics.jsonl). For reference the
table also shows, from the same run, the time from `fab train` starting to its first step:
the cost of a cold start, which a recovery partly repeats (worker processes import torch again).
Goal: kill <= 60 s. Defaults apply (process-group timeout 60 s), so the cut waits that long.

Usage: sudo .venv/bin/python bench/recovery.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fabrun import FabProcess, run_id_of  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

TRAIN = ["epochs=8", "checkpoint.every_steps=5", "data.batch_size=16"]


def records(run_dir: Path, name: str) -> list[dict]:
    out = []
    for path in sorted(run_dir.glob(f"hosts/*/{name}")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def one_fault(cluster: SimCluster, inventory: Path, fault: str) -> tuple[float, float]:
    """(seconds from launch to first step, seconds from fault to first step after resume)."""
    launched = time.time()
    run = FabProcess("train", "--inventory", str(inventory), "--nnodes", "2:3", "--", *TRAIN)
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 2 step", timeout=300))
        faulted = time.time()
        if fault == "kill":
            cluster.kill_processes(3)
            run.finish(timeout=600)
        else:
            with cluster.link_cut(3):
                run.finish(timeout=600)
    finally:
        run.close()
    subprocess.run([sys.executable, "-m", "fabric", "fetch-checkpoints", "--run", run_id], cwd=REPO,
                   capture_output=True, check=True)
    run_dir = REPO / "runs" / run_id
    steps = [r for r in records(run_dir, "metrics.rank0.jsonl") if r.get("kind") == "step"]
    resumed = min(r["time"] for r in records(run_dir, "metrics.jsonl") if r.get("kind") == "resume"
                  and r["time"] > faulted)
    first = min(r["time"] for r in steps)
    again = min(r["time"] for r in steps if r["time"] > resumed)
    return first - launched, again - faulted


def main() -> int:
    cluster = SimCluster("/tmp/meshrun-testbed")
    rows = []
    with exclusive():
        cluster.up(3)
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-recovery.yaml"))
            for fault in ("kill", "cut"):
                rows.append((fault, *one_fault(cluster, inventory, fault)))
        finally:
            cluster.down()
    print(f"{'fault':>5}  {'cold start to first step (s)':>28}  {'fault to stepping again (s)':>27}  {'ratio':>5}")
    for fault, cold, recovery in rows:
        print(f"{fault:>5}  {cold:>28.1f}  {recovery:>27.1f}  {recovery / cold:>5.1f}")
    print(f"P6: kill {rows[0][2]:.1f} s (goal <= 60 s), cut {rows[1][2]:.1f} s "
          "(process-group timeout 60 s + re-rendezvous)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
