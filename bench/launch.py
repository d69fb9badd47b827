"""P1: launch overhead of `fab train` against bare parallel `ssh host torchrun ...`.

On 3 simulated hosts (tests/testbed, needs root), every side starts the same tiny script
(bench/barrier_probe.py) with the same torchrun rendezvous flags; each rank prints the wall
time just after its first `dist.barrier()`. Measured: seconds from the start of the command
until the LAST rank is past that barrier, for

- `fab train` on the default path: pre-flight and code sync included, nothing changed since the
  last sync and the last run (one untimed `fab train` first, as a user's previous run; its
  pre-flight pass is then reused, deploy/run/preflightkey.py). Goal: ratio <= 1.3;
- `fab train --no-sync --skip-checks`. Goal: ratio <= 1.2;
- bare: three parallel `ssh host torchrun ...` (the baseline of both ratios).

Runs rotate default/fast/bare to cancel drift; each ratio is the median over the rounds.
`--profile far` (or home, any of tests/testbed/latency.py's) runs every side over that profile's
links: the controller's round trips to the hosts then cost what they cost a user whose hosts are
a continent away, and every serial step of the launch shows in the ratio.

Usage: sudo .venv/bin/python bench/launch.py [--repeats 3] [--profile lan|home|far]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meshrun.deploy.run.shell import remote_command  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

SCRIPT = "bench/barrier_probe.py"
BARRIER_RE = re.compile(r"BARRIER rank=(\d+) t=([\d.]+)")


def last_barrier(output: str, world: int) -> float:
    times = {int(r): float(t) for r, t in BARRIER_RE.findall(output)}
    if len(times) != world:
        raise RuntimeError(f"saw {len(times)} of {world} ranks past the barrier:\n{output[-2000:]}")
    return max(times.values())


FAST = ("--no-sync", "--skip-checks")


def run_fab(inventory: Path, flags: tuple[str, ...], env: dict[str, str]) -> float:
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "fabric", "train", "--inventory", str(inventory), *flags,
                           "--script", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return last_barrier(done.stdout, 3) - start


def bare_torchrun(i: int, run_id: str) -> list[str]:
    """What a user types by hand on host i (the same flags meshrun plans, minus its agent)."""
    head = "10.77.0.11"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:29400", "--rdzv-id", run_id,
            "--local-addr", f"10.77.0.1{i}"]
    if i == 1:
        argv += ["--rdzv-conf", "is_host=1"]
    return argv + [SCRIPT]


def run_ssh(cluster: SimCluster) -> float:
    run_id = "bare-" + secrets.token_hex(3)
    start = time.time()

    def one(i: int) -> str:
        command = remote_command("~/meshrun", bare_torchrun(i, run_id))
        done = subprocess.run(cluster.ssh_argv(i, command), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-1500:] + done.stderr[-1500:])
        return done.stdout

    with ThreadPoolExecutor(3) as pool:
        outputs = list(pool.map(one, (1, 2, 3)))
    return last_barrier("".join(outputs), 3) - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", default="lan", help="the test bed's network profile for every launch")
    args = parser.parse_args()
    cluster = SimCluster("/tmp/meshrun-testbed")
    with exclusive():
        cluster.up(3)
        try:
            profile = cluster.profile(args.profile) if args.profile != "lan" else contextlib.nullcontext()
            with profile:
                rounds = measure(cluster, args.repeats)
        finally:
            cluster.down()
    print_table(rounds, args.profile)
    return 0


def measure(cluster: SimCluster, repeats: int) -> list[tuple[float, float, float]]:
    """Rounds of (default path, fast path, bare), rotated."""
    inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-launch.yaml"))
    sync = subprocess.run([sys.executable, "-m", "fabric", "sync", "--inventory", str(inventory)], cwd=REPO,
                          capture_output=True, text=True)
    if sync.returncode != 0:
        raise RuntimeError(sync.stderr)
    # A private cache folder: the pre-flight pass reused is the one the warm-up stored.
    env = {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="meshrun-p1-")}
    run_fab(inventory, (), env)  # the user's previous run
    return [(run_fab(inventory, (), env), run_fab(inventory, FAST, env), run_ssh(cluster)) for _ in range(repeats)]


def print_table(rounds: list[tuple[float, float, float]], profile: str = "lan") -> None:
    print(f"{'round':>5}  {'fab train (s)':>13}  {'--no-sync --skip-checks (s)':>27}  {'bare ssh (s)':>12}  "
          f"{'default/bare':>12}  {'fast/bare':>9}")
    for n, (default_s, fast_s, bare_s) in enumerate(rounds, 1):
        print(f"{n:>5}  {default_s:>13.2f}  {fast_s:>27.2f}  {bare_s:>12.2f}  {default_s / bare_s:>12.2f}  "
              f"{fast_s / bare_s:>9.2f}")
    default = statistics.median(d / b for d, _, b in rounds)
    fast = statistics.median(f / b for _, f, b in rounds)
    print(f"P1 default path = median(fab train / bare) = {default:.2f}  (goal <= 1.3)")
    print(f"P1 --no-sync --skip-checks = median(fab / bare) = {fast:.2f}  (goal <= 1.2)  on 3 simulated hosts, "
          f"start to all ranks past their first barrier, profile {profile}")


if __name__ == "__main__":
    sys.exit(main())
