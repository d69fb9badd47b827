"""P6: how long an elastic run (`--nnodes 2:3`, 3 simulated hosts, digits) takes to recover from
losing a host, and how many steps it loses — meshrun against torchrun alone, in the same run.

Four faults, each in its own run, mid-epoch:
  kill worker   SIGKILL every process of h3 (torchrun, workers, its sshd sessions);
  cut  worker   take h3's link down (no TCP reset reaches anyone), healed when the run is over;
  kill rdzv     the same on h1, which hosts torchrun's c10d store;
  cut  rdzv     h1's link down.
Measured: seconds from the fault until a rank logs its first training step after the resume
(step records in metrics.rank0.jsonl, resume records in metrics.jsonl, from every host), and the
steps lost (last step logged before the fault minus the step the run resumed from).

Baseline: torchrun alone, started over ssh on each host the way a user types it (c10d rendezvous
with `is_host=1` and `--local-addr`, `--nnodes 2:3`, `--max-restarts 10`, torch's default rendezvous
timeouts, the trainer's own 60 s process-group timeout), same trainer, same faults on the workers.
Without meshrun nothing survives the rendezvous host (its c10d store is gone; pytorch issues
#67742, #150916), so the baseline is run for the worker faults only.

The last line names the worst case: `P6 worst: FAULT SECONDS`.
Usage: sudo .venv/bin/python bench/recovery.py [--faults kill-worker,cut-rdzv] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meshrun.deploy.run.shell import remote_command  # noqa: E402
from tests.fabrun import ROOT, FabProcess, run_id_of  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

# perf.every_steps=1: a step record per optimizer step, so "stepping again" is the first step after
# the resume, not the end of a 20-step window. log.progress_seconds: rank 0's progress.json follows
# every step, and is read just before the fault: the step records themselves are buffered (200 per
# write), so those of the last seconds before a SIGKILL never reach the file.
TRAIN = ["epochs=8", "checkpoint.every_steps=5", "data.batch_size=16", "perf.every_steps=1",
         "log.progress_seconds=0.02"]
FAULTS = ("kill-worker", "cut-worker", "kill-rdzv", "cut-rdzv")
HOST_OF = {"worker": 3, "rdzv": 1}


def records(run_dir: Path, name: str) -> list[dict]:
    out = []
    for path in sorted(run_dir.glob(f"hosts/*/{name}")) + sorted(run_dir.glob(name)):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def step_at_fault(cluster: SimCluster, run_id: str) -> int | None:
    """Rank 0's global step (h1 holds rank 0 until a fault), from its progress.json."""
    out = cluster.exec(1, ["cat", f"/root/meshrun/runs/{run_id}/progress.json"], check=False).stdout
    try:
        return int(json.loads(out)["global_step"])
    except (ValueError, KeyError, TypeError):
        return None


def recovery(steps: list[dict], resumes: list[dict], faulted: float,
             at_fault: int | None) -> tuple[float | None, int | None]:
    """(seconds from the fault to the first step after a resume, steps lost), None if it never resumed."""
    resumes = [r for r in resumes if r["time"] > faulted]
    if not resumes:
        return None, None
    resumed = min(resumes, key=lambda r: r["time"])
    after = [r["time"] for r in steps if r["time"] > resumed["time"]]
    lost = at_fault - resumed["from_step"] if at_fault is not None else None
    return (min(after) - faulted if after else None), lost


def inject(cluster: SimCluster, fault: str, wait: callable) -> None:
    kind, role = fault.split("-")
    host = HOST_OF[role]
    if kind == "kill":
        cluster.kill_processes(host)
        wait()
    else:
        with cluster.link_cut(host):
            wait()


def with_meshrun(cluster: SimCluster, inventory: Path, fault: str) -> tuple[float | None, int | None]:
    run = FabProcess("train", "--inventory", str(inventory), "--nnodes", "2:3", "--", *TRAIN)
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 2 step", timeout=300))
        at_fault = step_at_fault(cluster, run_id)
        faulted = time.time()
        inject(cluster, fault, lambda: run.finish(timeout=900))
    finally:
        run.close()
    subprocess.run([sys.executable, "-m", "fabric", "fetch-checkpoints", "--run", run_id], cwd=ROOT,
                   capture_output=True)
    run_dir = ROOT / "runs" / run_id
    steps = [r for r in records(run_dir, "metrics.rank0.jsonl") if r.get("kind") == "step"]
    resumes = [r for r in records(run_dir, "metrics.jsonl") if r.get("kind") == "resume"]
    return recovery(steps, resumes, faulted, at_fault)


def bare_torchrun(i: int, run_id: str) -> list[str]:
    argv = ["env", f"MESHRUN_RUN_ID={run_id}", f"MESHRUN_HOST=h{i}", sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "10", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "10.77.0.11:29400", "--rdzv-id", run_id, "--local-addr", f"10.77.0.1{i}"]
    if i == 1:
        argv += ["--rdzv-conf", "is_host=1"]
    return argv + ["-m", "meshrun.train", *TRAIN]


def with_torchrun_alone(cluster: SimCluster, fault: str, limit_s: float = 420) -> tuple[float | None, int | None]:
    run_id = "bare-" + secrets.token_hex(3)

    def one(i: int) -> None:
        command = remote_command("~/meshrun", ["timeout", "-k", "5", str(int(limit_s)), *bare_torchrun(i, run_id)])
        subprocess.run(cluster.ssh_argv(i, command), capture_output=True, timeout=limit_s + 30)

    pool = ThreadPoolExecutor(3)
    futures = [pool.submit(one, i) for i in (1, 2, 3)]
    log = Path(f"/tmp/meshrun-testbed-bare-{run_id}")
    deadline = time.time() + 300
    while time.time() < deadline and not _has_step(cluster, run_id, epoch=2):
        time.sleep(1)
    at_fault = step_at_fault(cluster, run_id)
    faulted = time.time()
    target = HOST_OF[fault.split("-")[1]]
    # The survivors finish (or give up); the faulted host's torchrun, cut off, would hang until the
    # limit, so it is killed once the others are done.
    inject(cluster, fault, lambda: [f.result() for i, f in zip((1, 2, 3), futures) if i != target])
    cluster.kill_processes(target)
    pool.shutdown()
    log.mkdir(exist_ok=True)
    for i in (1, 2, 3):
        text = cluster.exec(i, ["sh", "-c", f"cat /root/meshrun/runs/{run_id}/metrics*.jsonl 2>/dev/null"],
                            check=False).stdout
        (log / f"h{i}.jsonl").write_text(text)
    steps, resumes = [], []
    for path in log.glob("h*.jsonl"):
        for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
            (steps if r.get("kind") == "step" else resumes if r.get("kind") == "resume" else []).append(r)
    return recovery(steps, resumes, faulted, at_fault)


def _has_step(cluster: SimCluster, run_id: str, epoch: int) -> bool:
    out = cluster.exec(1, ["sh", "-c", f"cat /root/meshrun/runs/{run_id}/metrics.rank0.jsonl 2>/dev/null"],
                       check=False).stdout
    return any(json.loads(line).get("epoch", 0) >= epoch for line in out.splitlines() if '"step"' in line)


def cell(seconds: float | None, lost: int | None) -> str:
    return "never (job lost)" if seconds is None else f"{seconds:5.1f} s, {lost if lost is not None else '?'} steps"


def baseline_cell(fault: str, base: tuple[float | None, int | None], skipped: bool) -> str:
    if skipped:
        return "not run"
    if fault.endswith("rdzv"):
        return "not run: its store is gone"  # nothing can re-rendezvous without the c10d store's host
    return cell(*base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    cluster = SimCluster("/tmp/meshrun-testbed")
    rows = []
    with exclusive():
        cluster.up(3)
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-recovery.yaml"))
            subprocess.run([sys.executable, "-m", "fabric", "sync", "--inventory", str(inventory)], cwd=ROOT,
                           capture_output=True, check=True)
            for fault in faults:
                ours = with_meshrun(cluster, inventory, fault)
                base = (None, None) if args.no_baseline or fault.endswith("rdzv") else with_torchrun_alone(cluster, fault)
                rows.append((fault, ours, base))
        finally:
            cluster.down()
    print(f"{'fault':>12}  {'meshrun: fault to stepping again, steps lost':>44}  {'torchrun alone':>26}")
    for fault, ours, base in rows:
        print(f"{fault:>12}  {cell(*ours):>44}  {baseline_cell(fault, base, args.no_baseline):>26}")
    worst = max(rows, key=lambda r: float("inf") if r[1][0] is None else r[1][0])
    seconds = "never" if worst[1][0] is None else f"{worst[1][0]:.1f}"
    print(f"P6 worst: {worst[0]} {seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
