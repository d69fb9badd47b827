"""P4: `fab sync` to 3 simulated hosts over 100 Mbit links, against the floor.

On 3 simulated hosts (tests/testbed, needs root), every link tbf-shaped to 100 Mbit both ways:

- Full: `fab sync --data SRC:data/p4` of DATA_MB of random (incompressible) files, first time,
  ÷ the floor: the bytes over the slowest link, DATA_MB · 8 / 100 Mbit (each host has its own
  link, so the three copies run side by side). Goal <= 1.15.
- No-op: the same command again, nothing changed (code and data). Goal <= 1 s.
- Code only, no-op: `fab sync` with nothing changed (no goal; what `fab train` pays before a run).
- One changed 1 MB file: one data file rewritten, then the same command. Goal <= 2 s.

Each time is the whole command's wall time, Python start included, as a user sees it.
Ends with the line `P4 RATIO NOOP_S`.

Usage: sudo .venv/bin/python bench/sync.py [--mb 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

RATE_MBIT = 100
FILE_MB = 1
DEST = "data/p4"


def make_data(root: Path, mb: int) -> None:
    """`mb` files of 1 MB each in 10 folders: many files, like a dataset, none compressible."""
    for n in range(mb):
        folder = root / f"part{n % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n:04d}.bin").write_bytes(os.urandom(FILE_MB * 2**20))


def fab_sync(inventory: Path, data: Path | None) -> float:
    argv = [sys.executable, "-m", "fabric", "sync", "--inventory", str(inventory)]
    if data is not None:
        argv += ["--data", f"{data}:{DEST}"]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return took


def measure(cluster: SimCluster, inventory: Path, data: Path, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"full": [], "noop": [], "code": [], "one": []}
    fab_sync(inventory, None)  # the code is there before we time data
    for r in range(repeats):
        for i in (1, 2, 3):
            cluster.exec(i, ["rm", "-rf", f"/root/meshrun/{DEST}"])
        with cluster.shaped(f"{RATE_MBIT}mbit"):
            times["full"].append(fab_sync(inventory, data))
            times["noop"].append(fab_sync(inventory, data))
            times["code"].append(fab_sync(inventory, None))
            (data / "part3" / "f0003.bin").write_bytes(os.urandom(FILE_MB * 2**20))
            times["one"].append(fab_sync(inventory, data))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="meshrun-p4-"))
    cluster = SimCluster("/tmp/meshrun-testbed")
    try:
        make_data(data, args.mb)
        with exclusive():
            cluster.up(3)
            try:
                inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-sync.yaml"))
                times = measure(cluster, inventory, data, args.repeats)
            finally:
                cluster.down()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    floor = args.mb * 2**20 * 8 / (RATE_MBIT * 1e6)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'case':<34} {'runs (s)':<28} {'median (s)':>10}  {'goal':>10}")
    rows = (("full", f"{args.mb} MB to 3 hosts (÷ floor {floor:.1f} s)", f"{med['full'] / floor:.2f}x", "<= 1.15x"),
            ("noop", "no-op resync, code + data", f"{med['noop']:.2f}", "<= 1 s"),
            ("code", "no-op resync, code only", f"{med['code']:.2f}", "-"),
            ("one", f"one changed {FILE_MB} MB file", f"{med['one']:.2f}", "<= 2 s"))
    for key, label, shown, goal in rows:
        runs = " ".join(f"{t:.2f}" for t in times[key])
        print(f"{label:<34} {runs:<28} {med[key]:>10.2f}  {shown + ' / ' + goal:>10}")
    print(f"P4 {med['full'] / floor:.2f} {med['noop']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
