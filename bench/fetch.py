"""`fab fetch-checkpoints` of a 3-host run: the bytes that cross the links, one holder's copy ÷ every copy.

On 3 simulated hosts (tests/testbed, needs root), each holding the same checkpoints (CKPT_FILES
files of --mb MiB of random bytes, planted byte-identical on every host as the trainer writes them,
with their manifest and a small log), every link tbf-shaped to --mbit both ways:

- default: `fab fetch-checkpoints` (every host's logs and manifest, one holder's checkpoints);
- every copy: `fab fetch-checkpoints --every-copy` into another folder (what every fetch did before).

Bytes are what the hosts sent: the receive counters of their links' controller ends
(`/proc/net/dev`, the `mrt<i>h` veths), SSH and rsync included. Each time is the whole command's
wall time. Each host has its own shaped link here, so the copies run side by side and the times
stay close; on a real controller the copies share its one downlink, and the time goes as the bytes.
Ends with the line `FETCH BYTES_RATIO TIME_RATIO` (default ÷ every copy).

Usage: sudo .venv/bin/python bench/fetch.py [--mb 16] [--mbit 100] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fabrun import fab  # noqa: E402
from tests.hostile import HostileRun, manifest, plant_runs, remove_run, sha256  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

HOSTS = (1, 2, 3)
CKPT_FILES = 3  # the trainer's keep_last


def received() -> int:
    """Bytes the controller's ends of the hosts' links received so far."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, counters = line.split(":", 1)
        if name.strip() in {f"mrt{i}h" for i in HOSTS}:
            total += int(counters.split()[0])
    return total


def planted(mb: int) -> HostileRun:
    files = {f"checkpoints/ckpt-step{100 * (k + 1):09d}.pt": os.urandom(mb << 20) for k in range(CKPT_FILES)}
    lines = [f"{sha256(data)}  {name.removeprefix('checkpoints/')}".encode() for name, data in files.items()]
    return HostileRun(files={**files, "checkpoints/MANIFEST.sha256": manifest(*lines), "train.log": b"log\n" * 100})


def one_fetch(run_id: str, *flags: str) -> tuple[int, float]:
    before, start = received(), time.monotonic()
    done = fab("fetch-checkpoints", "--run", run_id, *flags, timeout=900)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return received() - before, took


def measure(cluster: SimCluster, inventory: Path, mb: int, mbit: int, repeats: int) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {"default": [], "every": []}
    run = planted(mb)
    for _ in range(repeats):
        run_id = plant_runs(cluster, {i: run for i in HOSTS}, inventory)
        try:
            with cluster.shaped(f"{mbit}mbit"):
                found["default"].append(one_fetch(run_id))
                found["every"].append(one_fetch(run_id, "--every-copy", "--dest", tempfile.mkdtemp(prefix="mr-fetch-")))
        finally:
            for i in HOSTS:
                remove_run(cluster, i, run_id)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=16)
    parser.add_argument("--mbit", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cluster = SimCluster("/tmp/meshrun-testbed")
    with exclusive():
        cluster.up(len(HOSTS))
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-fetch.yaml"))
            found = measure(cluster, inventory, args.mb, args.mbit, args.repeats)
        finally:
            cluster.down()
    med = {k: (statistics.median(b for b, _ in v), statistics.median(t for _, t in v)) for k, v in found.items()}
    print(f"3 hosts, {CKPT_FILES} checkpoints of {args.mb} MiB each on every host, links {args.mbit} Mbit/s")
    print(f"{'fetch':<34} {'MiB received (runs)':<26} {'s (runs)':<18}")
    for key, label in (("default", "default (one holder's copy)"), ("every", "--every-copy (each host's)")):
        mib = " ".join(f"{b / 2**20:.1f}" for b, _ in found[key])
        secs = " ".join(f"{t:.1f}" for _, t in found[key])
        print(f"{label:<34} {mib:<26} {secs:<18}")
    bytes_ratio = med["default"][0] / med["every"][0]
    time_ratio = med["default"][1] / med["every"][1]
    print(f"FETCH {bytes_ratio:.2f} {time_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
