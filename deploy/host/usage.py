"""How busy a run is on this host, for idle detection: `python -m meshrun.deploy.host.usage RUN_ID HOST`.
Standard library only. Prints one JSON object:

    {"time": now, "cpu_s": CPU seconds (user + system) of the run's live processes, "procs": how many,
     "per_pid": {pid: CPU seconds} (at most 256), "gpu_util": [percent per GPU the run's workers see] or null,
     "checkpoint": the newest step this host's checkpoint manifest lists, or null}

The run's processes are found by their environment tags (`procs.tagged_pids`), never by name. GPU
utilisation comes from nvidia-smi where there is one: the GPUs named by the workers'
CUDA_VISIBLE_DEVICES when they are indices, else every GPU. The controller turns two answers into
a utilisation (`deploy/run/idle.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS, checkpoint_step, run_dir
from meshrun.deploy.host.procs import tagged_pids

NVIDIA_SMI_TIMEOUT_S = 10
MAX_PIDS = 256
MANIFEST_READ = 1 << 20  # the trainer's manifest is a few hundred bytes
GPU_QUERY = ("--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15 of stat(5)


def visible_gpus(pids: list[int]) -> set[int] | None:
    """The GPU indices the run's processes are given (CUDA_VISIBLE_DEVICES), None when not indices."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        value = env.get(b"CUDA_VISIBLE_DEVICES")
        if value is not None:
            parts = value.decode(errors="replace").split(",")
            return {int(p) for p in parts if p.strip().isascii() and p.strip().isdigit()} or None
    return None


def gpu_util(pids: list[int]) -> list[int] | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, *GPU_QUERY], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    wanted = visible_gpus(pids)
    found = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts):
            if wanted is None or int(parts[0]) in wanted:
                found.append(int(parts[1]))
    return found or None


def newest_checkpoint(run_id: str) -> int | None:
    """The newest periodic checkpoint the run's manifest here lists (the trainer's exact names only)."""
    try:
        with open(f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}", "rb") as f:
            text = f.read(MANIFEST_READ).decode("ascii", "replace")
    except OSError:
        return None
    steps = [checkpoint_step(line.split("  ", 1)[1]) for line in text.splitlines() if "  " in line]
    return max((s for s in steps if s is not None), default=None)


def usage(run_id: str, host: str) -> dict:
    pids = sorted(tagged_pids(run_id, host))
    per_pid = {str(pid): t for pid in pids if (t := cpu_seconds(pid)) is not None}
    return {"time": time.time(), "cpu_s": round(sum(per_pid.values()), 3), "procs": len(per_pid),
            "per_pid": dict(list(per_pid.items())[:MAX_PIDS]), "gpu_util": gpu_util(pids),
            "checkpoint": newest_checkpoint(run_id)}


if __name__ == "__main__":
    print(json.dumps(usage(sys.argv[1], sys.argv[2])))
