"""How busy a run is on this host, for idle detection: `python -m meshrun.deploy.host.usage RUN_ID HOST`.
Standard library only. Prints one JSON object:

    {"time": now, "cpu_s": CPU seconds (user + system) of the run's live processes, "procs": how many,
     "per_pid": {pid: CPU seconds} (at most 256), "gpu_util": [percent per GPU nvidia-smi lists one of
              the run's processes on] or null,
     "checkpoint": the newest step this host's checkpoint manifest lists, or null,
     "checkpoint_time": when the manifest was last written, or null,
     "gpus": [[index, util %, memory used MiB, memory total MiB, temperature °C] per GPU, null where
              nvidia-smi says N/A] or null, "rss": resident bytes of the run's processes,
     "rtt_ms": one TCP connect to the current rendezvous store, in ms, or null ("rtt_missed": it
               did not answer within RTT_TIMEOUT_S), "events": the last lines of this host's agent
               events file (deploy/host/agent.py), at most EVENTS_KEPT}

The run's processes are found by their environment tags (`procs.tagged_pids`), never by name. GPU
figures come from nvidia-smi where there is one: the GPUs nvidia-smi lists the run's processes on
(`--query-compute-apps`, matched by pid and GPU UUID); where it lists none of them (before CUDA
starts, a run that trains on CPU on a host with a GPU, or a container whose pids nvidia-smi does not
see), the GPUs named by the workers' CUDA_VISIBLE_DEVICES when they are indices (nvidia-smi's: the
plan sets CUDA_DEVICE_ORDER=PCI_BUS_ID with them), else every GPU. Only the first kind is the run's
`gpu_util`, which the idle rule prefers to the CPU share (`meshrun.idlerule`): an idle GPU that none
of the run's processes is on says nothing of the run (its ranks may train on CPU: `nproc` above the
GPU count, a CPU build of torch, a driver too old), so the CPU share judges it; the other kinds
are shown only (`gpus`). The controller turns two answers into
a utilisation (`deploy/run/idle.py`) and `fab status --watch`'s cells (`deploy/run/hostusage.py`).
Every part is bounded in time (nvidia-smi's two queries together, one connect) and in size.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

from meshrun.layout import (AGENT_PIDFILE, CHECKPOINT_MANIFEST, CHECKPOINTS, EVENTS, checkpoint_step, host_dir,
                            run_dir)
from meshrun.deploy.host.procs import tagged_pids

NVIDIA_SMI_TIMEOUT_S = 3
MAX_PIDS = 256
MANIFEST_READ = 1 << 20  # the trainer's manifest is a few hundred bytes
# The UUID last: it ties a GPU to the compute apps' lines; the answer's rows keep the five figures.
GPU_QUERY = ("--query-gpu=index,utilization.gpu,memory.used,memory.total,temperature.gpu,uuid",
             "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader")
SMI_READ = 1 << 20  # what is parsed of nvidia-smi's answer: a few lines per GPU and per process
SMI_LINES = 4096
GPU_UUID_RE = re.compile(r"GPU-[0-9A-Fa-f-]{1,64}")
RTT_TIMEOUT_S = 1.0
PIDFILE_READ = 1 << 20
EVENTS_READ = 16 << 10  # the tail of the events file read
EVENTS_KEPT = 20


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


def _lines(text: str) -> list[list[str]]:
    """nvidia-smi's CSV lines, bounded, each split into stripped fields."""
    return [[p.strip() for p in line.split(",")] for line in text[:SMI_READ].splitlines()[:SMI_LINES]]


def _count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) < 10


def parse_gpus(text: str, wanted: set[int] | None) -> list[list[int | None]]:
    """nvidia-smi's `GPU_QUERY` lines (the UUID last, or absent) → [index, util, memory used, memory
    total, temperature] of each wanted GPU; a figure nvidia-smi cannot give (`[N/A]`, `[Not
    Supported]`) is None."""
    found: list[list[int | None]] = []
    for parts in _lines(text):
        if len(parts) not in (5, 6) or not _count(parts[0]):
            continue
        if wanted is None or int(parts[0]) in wanted:
            found.append([int(p) if _count(p) else None for p in parts[:5]])
    return found


def gpu_uuids(text: str) -> dict[str, int]:
    """nvidia-smi's `GPU_QUERY` lines → {GPU UUID: index}."""
    return {parts[5]: int(parts[0]) for parts in _lines(text)
            if len(parts) == 6 and _count(parts[0]) and GPU_UUID_RE.fullmatch(parts[5])}


def run_gpus(apps: str, uuids: dict[str, int], pids: list[int]) -> set[int] | None:
    """The indices of the GPUs `--query-compute-apps` lists the run's processes on (`apps`: its
    `pid, gpu_uuid` lines); None when it lists none of them."""
    ours = {str(pid) for pid in pids}
    found = {uuids[parts[1]] for parts in _lines(apps)
             if len(parts) == 2 and _count(parts[0]) and parts[0] in ours and parts[1] in uuids}
    return found or None


def _smi(tool: str, query: tuple[str, ...], timeout: float) -> str | None:
    try:
        out = subprocess.run([tool, *query], capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout  # a failing status may still list the GPUs that answered


def gpu_figures(pids: list[int]) -> tuple[list[list[int | None]] | None, set[int] | None]:
    """(`gpus`, the indices nvidia-smi lists the run's processes on or None). Both queries
    together take at most NVIDIA_SMI_TIMEOUT_S."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None, None
    deadline = time.monotonic() + NVIDIA_SMI_TIMEOUT_S
    text = _smi(tool, GPU_QUERY, NVIDIA_SMI_TIMEOUT_S)
    if text is None:
        return None, None
    left = deadline - time.monotonic()
    apps = _smi(tool, APPS_QUERY, left) if pids and left > 0.1 else None
    held = run_gpus(apps, gpu_uuids(text), pids) if apps is not None else None
    return parse_gpus(text, held if held is not None else visible_gpus(pids)) or None, held


def gpus(pids: list[int]) -> list[list[int | None]] | None:
    """The run's GPUs' figures: those nvidia-smi lists its processes on, else `visible_gpus`' rule."""
    return gpu_figures(pids)[0]


def held_util(found: list[list[int | None]] | None, held: set[int] | None) -> list[int] | None:
    """The utilisation of the GPUs the run's processes are on (`gpu_figures`), None without one:
    the idle rule then judges the run by its CPU share."""
    util = [g[1] for g in found or () if held is not None and g[0] in held and g[1] is not None]
    return util or None


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of the run's processes (statm's second field, in pages)."""
    total = 0
    for pid in pids[:MAX_PIDS]:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read(200).split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


def rendezvous_endpoint(run_id: str, host: str) -> str | None:
    """The current generation's `--rdzv-endpoint`, from this host's agent pidfile (None: standalone)."""
    try:
        with open(f"{host_dir(run_id, host)}/{AGENT_PIDFILE}", "rb") as f:
            command = json.loads(f.read(PIDFILE_READ)).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(command, list):
        return None
    for flag, value in zip(command, command[1:]):
        if flag in ("--rdzv-endpoint", "--rdzv_endpoint") and isinstance(value, str) and ":" in value:
            return value
    return None


def rtt_ms(endpoint: str | None) -> tuple[float | None, bool]:
    """One TCP connect to the rendezvous store, as the succession's watcher makes every 2 s
    (deploy/host/succession.py): (milliseconds or None, whether it went unanswered)."""
    if endpoint is None:
        return None, False
    address, _, port = endpoint.rpartition(":")
    started = time.monotonic()
    try:
        with socket.create_connection((address.strip("[]"), int(port)), timeout=RTT_TIMEOUT_S):
            return round((time.monotonic() - started) * 1000, 2), False
    except (OSError, ValueError):
        return None, True


def recent_events(run_id: str, host: str) -> list[object]:
    """The last EVENTS_KEPT lines of this host's agent events file that are JSON."""
    try:
        with open(f"{host_dir(run_id, host)}/{EVENTS}", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - EVENTS_READ))
            lines = f.read(EVENTS_READ).splitlines()[-EVENTS_KEPT:]
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def newest_checkpoint(run_id: str) -> int | None:
    """The newest periodic checkpoint the run's manifest here lists (the trainer's exact names only)."""
    try:
        with open(f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}", "rb") as f:
            text = f.read(MANIFEST_READ).decode("ascii", "replace")
    except OSError:
        return None
    steps = [checkpoint_step(line.split("  ", 1)[1]) for line in text.splitlines() if "  " in line]
    return max((s for s in steps if s is not None), default=None)


def manifest_time(run_id: str) -> float | None:
    try:
        return os.stat(f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}").st_mtime
    except OSError:
        return None


def busy(run_id: str, host: str) -> tuple[dict, list[int], list[list[int | None]] | None]:
    """How busy the run is here: the idle rule's sample (time, CPU seconds per run process, the
    utilisation of the GPUs its processes are on), and the run's pids and GPUs for the rest of `usage`."""
    pids = sorted(tagged_pids(run_id, host))
    per_pid = {str(pid): t for pid in pids if (t := cpu_seconds(pid)) is not None}
    found, held = gpu_figures(pids)
    return ({"time": time.time(), "cpu_s": round(sum(per_pid.values()), 3), "procs": len(per_pid),
             "per_pid": dict(list(per_pid.items())[:MAX_PIDS]),
             "gpu_util": held_util(found, held)}, pids, found)


def usage(run_id: str, host: str) -> dict:
    sample, pids, found = busy(run_id, host)
    rtt, missed = rtt_ms(rendezvous_endpoint(run_id, host))
    return {**sample, "checkpoint": newest_checkpoint(run_id), "checkpoint_time": manifest_time(run_id), "gpus": found,
            "rss": rss_bytes(pids), "rtt_ms": rtt, "rtt_missed": missed, "events": recent_events(run_id, host)}


if __name__ == "__main__":
    print(json.dumps(usage(sys.argv[1], sys.argv[2])))
