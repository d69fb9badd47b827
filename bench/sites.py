"""P9: hierarchical synchronisation on two sites (issue 22, docs/sites.md).

3 simulated hosts (tests/testbed, needs root), one process each, declared as sites h1, h2
`office` and h3 `home`; the test bed's `two-site` profile puts h1, h2 on the unshaped LAN and
shapes and delays every packet between them and h3 as `home` (20 Mbit/s, 40 ms RTT). The job,
H = 32 and the target are bench/wan.py's (an MLP with 4.55 MB of fp32 gradients whose optimizer
step computes ~100 ms on 2 shared cores, target test accuracy 0.96).

- P9: time to the target (train + eval seconds of the epochs until the first at or above it) on
  `two-site` ÷ the same method on `lan`, for plain DDP (`none`), flat `diloco-overlap` and
  `hier`. Goal: hier <= 1.1 and better than flat DiLoCo-overlap, its final accuracy on lan within
  1 point of plain DDP's on lan. `none` on two-site crosses the 20 Mbit/s link every step (~11 min
  an epoch, as on home): by default it runs a short epoch that gives its bytes per step, and has
  no ratio (`--none-to-target` runs it to the target).
- Bytes between sites per optimizer step: h3's eth0 tx bytes over the training phase ÷ optimizer
  steps (h3 is alone at its site: everything it sends crosses, besides its log lines to the
  controller).

Ends with the line `P9 best: METHOD RATIO`.
Usage: sudo .venv/bin/python bench/sites.py [--epochs 3] [--methods none,diloco-overlap,hier] [--none-to-target]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.wan import HOSTS, TARGET, Run, run_all  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

SITES = {"h1": "office", "h2": "office", "h3": "home"}
METHODS = "none,diloco-overlap,hier"
GOAL = 1.1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3, help="epochs on lan (two-site runs stop at the target)")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--none-to-target", action="store_true")
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for the test bed lock")
    args = parser.parse_args()
    methods = args.methods.split(",")
    cluster = SimCluster("/tmp/meshrun-testbed")
    started = time.time()
    with exclusive(timeout=args.wait):
        cluster.up(HOSTS)
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-sites.yaml"),
                                                host_overrides={h: {"site": s} for h, s in SITES.items()})
            runs = run_all(cluster, inventory, [("lan", methods), ("two-site", methods)], args.epochs,
                           args.none_to_target, lambda run: (
                               f"to {TARGET:.2f}: {run.time_to_target} (epoch {run.hit_epoch}), final "
                               f"{run.final_acc:.4f}, step {run.step_s * 1e3:.1f} ms, h3 sent "
                               f"{run.host_bytes_per_step[-1] / 1e3:.0f} kB/step ({run.wall_s:.0f} s)"))
        finally:
            cluster.down()
    print(f"bench total {time.time() - started:.0f} s")
    report(runs, methods)
    return 0


def report(runs: list[Run], methods: list[str]) -> None:
    by = {(r.shape, r.hook): r for r in runs}
    base = by.get(("lan", "none"))
    print(f"\nP9: time to test accuracy {TARGET:.2f}, two-site ÷ lan, 3 hosts (office h1, h2 | home h3); "
          f"goal: hier <= {GOAL} and below diloco-overlap, within 1 point of none on lan")
    print(f"{'method':>14}  {'lan s':>6}  {'two-site s':>10}  {'ratio':>5}  {'final acc':>9}  {'Δ vs none':>9}  "
          f"{'between kB/step':>15}")
    best: tuple[float, str] | None = None
    for method in methods:
        a, b = by.get(("lan", method)), by.get(("two-site", method))
        if a is None or b is None:
            continue
        ratio = b.time_to_target / a.time_to_target if a.time_to_target and b.time_to_target else None
        delta = (a.final_acc - base.final_acc) * 100 if base else float("nan")
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        print(f"{method:>14}  {fmt(a.time_to_target):>6}  {fmt(b.time_to_target):>10}  "
              f"{(f'{ratio:.2f}' if ratio else '-'):>5}  {a.final_acc:>9.4f}  {delta:>+8.1f}p  "
              f"{b.host_bytes_per_step[-1] / 1e3:>15.0f}")
        if ratio is not None and delta >= -1.0 and (best is None or ratio < best[0]):
            best = (ratio, method)
    print("between kB/step: h3's eth0 tx bytes per optimizer step on two-site (all of it crosses between sites)")
    print(f"P9 best: {best[1]} {best[0]:.2f}" if best else "P9 best: - nan")


if __name__ == "__main__":
    sys.exit(main())
