"""P2/P3: gradient communication over the test bed's network profiles (lan, home, far).

On 3 simulated hosts (tests/testbed, needs root), `fab train` runs one job per method, one
process per host, under `SimCluster.profile(name)` (tbf rate + NFQUEUE delay, see
docs/performance.md "Latency in the test bed"). The job: an MLP 75-1024-1024-10 (1.14 M
parameters, 4.55 MB of fp32 gradients) on the trainer's synthetic images at 5x5x3 (10 classes,
template + unit noise: about 99 % separable, so the target is about learning, not luck),
512 samples per rank, SGD lr 0.0006 momentum 0.9 constant, 256 optimizer steps per epoch,
TARGET test accuracy 0.96 (reached at the end of epoch 2, 512 steps, by every method on lan).
Why this job: on 2 shared CPU cores an optimizer step of 512 samples computes in ~90-110 ms, so
a DiLoCo round of H = 32 steps computes longer than one full all-reduce takes on home (4.55 MB
at 20 Mbit/s: ~2.4-2.7 s), the regime DiLoCo is built for (a GPU job with a larger model is in
it at any H). With digits' 1437 samples, a step this heavy would leave 1 step per epoch.

- DiLoCo's H = 32 is chosen by that rule: H x step compute >= the round's all-reduce on the
  slowest profile measured (home), so the overlapped variant hides it; 8 rounds per epoch, so
  only the last round of an epoch (flushed before evaluation) is exposed.
- P3: time to TARGET (train + eval seconds of the epochs until the first at or above it) on
  home (and far) ÷ the same job on lan, per method: none, fp16, powersgd, localsgd, diloco,
  diloco-overlap. Goal <= 1.3 for the best method, with its final accuracy on lan within 1 point
  of plain DDP (`none`) on lan. A profile changes timing, not arithmetic (same seed, fixed ring
  order, constant LR), so a shaped run stops at the epoch where its lan twin reached the target.
- P2 on home: the trainer's measured all-reduce per step (comm record, hook none) ÷ its floor
  2(N-1)/N · S / B + (N-1) · RTT per all-reduce (deploy/run/commplan.py::hook_floor). Goal <= 1.3.
- Bytes per step: each host's eth0 tx_bytes (read inside its namespace) sampled twice a second,
  interpolated at the start of the first epoch and the end of the last epoch's training, summed
  over hosts, divided by hosts x optimizer steps. Beside it, each host's bytes received from the
  hosts the profile delays (the byte counters of the test bed's delay chain; bench/sites.py: what
  crosses between sites).

Ends with the line `P3 best: METHOD RATIO` (home ÷ lan, the best method within 1 point).
`none` off lan runs a short epoch for P2 only (to the target it would take ~12 min an epoch on
home; `--none-to-target`). The run in docs/performance.md (methods none, powersgd, diloco,
diloco-overlap; far without powersgd) took about 25 min; fp16 and localsgd add ~10 min each.

Usage: sudo .venv/bin/python bench/wan.py [--epochs 3] [--methods none,fp16,...] [--profiles lan,home,far]
                                          [--far-methods ...] [--none-to-target]
"""

from __future__ import annotations

import argparse
import bisect
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meshrun.deploy.run.commplan import Hook, HookSettings, hook_bytes, hook_floor  # noqa: E402
from tests.testbed.latency import lookup  # noqa: E402
from tests.fabrun import run_id_of  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.latency import CHAIN, IPTABLES  # noqa: E402
from tests.testbed.layout import GATEWAY  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

HOSTS = 3
HIDDEN = [1024, 1024]
SHAPES = [[1024, 75], [1024], [1024, 1024], [1024], [10, 1024], [10]]  # python -m meshrun.train --describe
SETTINGS = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=32)
BATCH = 512  # per rank
STEPS_PER_EPOCH = 256
P2_ONLY_STEPS = 8  # `none` off lan: a short epoch for P2 (its comm probe), not run to the target
TARGET = 0.96
METHODS = "none,fp16,powersgd,localsgd,diloco,diloco-overlap"
# Twice a second: the time, eth0's tx bytes, and the bytes the delay chain's rules counted from
# other hosts (not from the controller, GATEWAY): 0 on lan, where the chain does not exist.
SAMPLER = ("import subprocess, sys, time\n"
           "argv, gateway = sys.argv[1:-1], sys.argv[-1]\n"
           "def delayed():\n"
           "    out = subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()[2:]\n"
           "    return sum(int(f[1]) for f in (line.split() for line in out) if len(f) > 7 and f[7] != gateway)\n"
           "while True:\n"
           "    v = open('/sys/class/net/eth0/statistics/tx_bytes').read().strip()\n"
           "    print(time.time(), v, delayed(), flush=True)\n"
           "    time.sleep(0.5)\n")


WIRES = {"bf16": "comm.diloco_wire_dtype=bf16"}  # a method `hier+bf16`: hier, pseudo-gradients in bf16


def hook_of(method: str) -> str:
    """`hier+bf16` → `hier`: the `--comm` value of a bench method."""
    return method.partition("+")[0]


def overrides(hook: str, epochs: int, steps_per_epoch: int = STEPS_PER_EPOCH, hosts: int = HOSTS) -> list[str]:
    """`hook`: a bench method, a `comm.hook` value with an optional `+bf16` (its wire dtype)."""
    wire = hook.partition("+")[2]
    return ([WIRES[wire]] if wire else []) + [
            f"epochs={epochs}", f"model.hidden=[{HIDDEN[0]},{HIDDEN[1]}]", "model.dropout=0.0",
            "data.name=synthetic_images", "data.image_size=5", "data.num_classes=10",
            f"data.train_size={steps_per_epoch * BATCH * hosts}", "data.test_size=2000",
            f"data.batch_size={BATCH}", "optim.lr=0.0006", "optim.momentum=0.9", "schedule.name=constant", "log.tensorboard=false", "log.print_every_steps=100",
            "perf.comm_probe_steps=3", f"comm.hook={hook_of(hook)}", "comm.start_iter=2",
            f"comm.powersgd_rank={SETTINGS.powersgd_rank}",
            f"comm.localsgd_period={SETTINGS.localsgd_period}",
            f"comm.diloco_inner_steps={SETTINGS.diloco_inner_steps}"]


class TxSampler:
    """tx_bytes of eth0 inside each host and the bytes it received through the delay chain, with
    timestamps, from one small loop per host."""

    def __init__(self, cluster: SimCluster, hosts: int = HOSTS) -> None:
        self.series: dict[int, list[tuple[float, int]]] = {i: [] for i in range(1, hosts + 1)}
        self.delayed: dict[int, list[tuple[float, int]]] = {i: [] for i in self.series}
        argv = ["python3", "-c", SAMPLER, *IPTABLES, "-L", CHAIN, "-v", "-x", "-n", GATEWAY]
        self.procs = [cluster.popen(i, argv, stdout=subprocess.PIPE, text=True) for i in self.series]
        self.threads = [threading.Thread(target=self._read, args=(i, p), daemon=True)
                        for i, p in zip(self.series, self.procs)]
        for t in self.threads:
            t.start()

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t, v, d = line.split()
            self.series[i].append((float(t), int(v)))
            self.delayed[i].append((float(t), int(d)))

    def at(self, i: int, when: float, delayed: bool = False) -> float:
        """Host i's eth0 tx bytes (or, `delayed`, the bytes it received from delayed hosts) at `when`."""
        s = (self.delayed if delayed else self.series)[i]
        k = bisect.bisect_left([t for t, _ in s], when)
        if k <= 0 or k >= len(s):
            raise RuntimeError(f"h{i}: no tx sample around {when} ({len(s)} samples)")
        (t0, v0), (t1, v1) = s[k - 1], s[k]
        return v0 + (v1 - v0) * (when - t0) / (t1 - t0)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
            p.wait(timeout=10)


@dataclass(frozen=True)
class Run:
    hook: str
    shape: str
    comm_s: float  # rank 0's comm probe
    step_s: float  # median wall time per optimizer step (rank 0 step records)
    time_to_target: float | None
    hit_epoch: int | None
    final_acc: float
    bytes_per_step: float  # per host
    steps: int
    wall_s: float
    epochs_run: int = 1
    host_bytes_per_step: tuple[float, ...] = ()  # per host h1..hN (bench/sites.py: h3's is all between sites)
    run_id: str = ""  # the controller's runs/<run_id>/ (commplan.json with --comm)
    step_times: tuple[float, ...] = ()  # rank 0's step records' step_s, in order
    delayed_rx_per_step: tuple[float, ...] = ()  # per host: bytes received from hosts the profile delays
    sync_to_target: float | None = None  # of time_to_target: the replicas made one before each evaluation


def one_run(cluster: SimCluster, inventory: Path, hook: str, shape: str, epochs: int, first: bool,
            steps_per_epoch: int = STEPS_PER_EPOCH, extra: Sequence[str] = (), hosts: int = HOSTS) -> Run:
    """`extra`: more `fab train` flags (e.g. `--comm hier`); overrides (with `=`) go after `--`."""
    sampler = TxSampler(cluster, hosts)
    started = time.time()
    flags = ["--skip-checks"] + ([] if first else ["--no-sync"]) + [f for f in extra if "=" not in f]
    done = subprocess.run([sys.executable, "-m", "fabric", "train", "--inventory", str(inventory), *flags, "--",
                           *overrides(hook, epochs, steps_per_epoch, hosts), *[f for f in extra if "=" in f]],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    time.sleep(1.0)  # one more tx sample after the end
    sampler.close()
    if done.returncode != 0:  # still report the run if its metrics are complete, but say so
        print(f"  {shape:>8} {hook:>8}: fab train exited {done.returncode}:\n{done.stdout[-1500:]}", flush=True)
    run_id = run_id_of(done.stdout)
    remote = f"/root/meshrun/runs/{run_id}"  # rank 0 runs on h1
    main = [json.loads(x) for x in cluster.exec(1, ["cat", f"{remote}/metrics.jsonl"]).stdout.splitlines() if x]
    rank0 = [json.loads(x) for x in cluster.exec(1, ["cat", f"{remote}/metrics.rank0.jsonl"]).stdout.splitlines() if x]
    epochs_ = [r for r in main if r["kind"] == "epoch"]
    comms = [r for r in rank0 if r["kind"] == "comm"]
    comm_s = comms[-1]["comm_s"] if comms else float("nan")
    steps = [r for r in rank0 if r["kind"] == "step"]
    per_step = sorted(r["step_s"] for r in steps)
    elapsed, synced, hit, hit_epoch, hit_sync = 0.0, 0.0, None, None, None
    for r in epochs_:
        elapsed += r["train_seconds"] + r["eval_seconds"]
        synced += r.get("sync_seconds", 0.0)
        if hit is None and r["test_acc"] >= TARGET:
            hit, hit_epoch, hit_sync = elapsed, r["epoch"], synced
    first_start = epochs_[0]["time"] - epochs_[0]["train_seconds"] - epochs_[0]["eval_seconds"]
    train_end = epochs_[-1]["time"] - epochs_[-1]["eval_seconds"]
    per_host = [sampler.at(i, train_end) - sampler.at(i, first_start) for i in range(1, hosts + 1)]
    delayed = [sampler.at(i, train_end, True) - sampler.at(i, first_start, True) for i in range(1, hosts + 1)]
    sent = sum(per_host)
    total_steps = epochs_[-1]["global_step"]
    median = per_step[len(per_step) // 2] if per_step else float("nan")
    if steps_per_epoch != STEPS_PER_EPOCH:  # a P2-only run: its accuracy says nothing
        hit = hit_epoch = hit_sync = None
    return Run(hook, shape, comm_s, median, hit, hit_epoch, epochs_[-1]["test_acc"],
               sent / hosts / total_steps, total_steps, time.time() - started, len(epochs_),
               tuple(b / total_steps for b in per_host), run_id, tuple(r["step_s"] for r in steps),
               tuple(b / total_steps for b in delayed), hit_sync)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3, help="epochs on lan (shaped runs stop at the target)")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--profiles", default="lan,home,far", help="lan first: the baseline")
    parser.add_argument("--far-methods", default=None, help="methods run on far (default: --methods)")
    parser.add_argument("--none-to-target", action="store_true",
                        help="run `none` off lan to the target too (~11 min an epoch on home); by default it runs "
                             f"{P2_ONLY_STEPS} steps, for P2 only, and has no P3 ratio")
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for the test bed lock")
    args = parser.parse_args()
    methods, profiles = args.methods.split(","), [p for p in args.profiles.split(",") if p != "lan"]
    far_methods = args.far_methods.split(",") if args.far_methods else methods
    cluster = SimCluster("/tmp/meshrun-testbed")
    runs: list[Run] = []
    started = time.time()
    with exclusive(timeout=args.wait):
        cluster.up(HOSTS)
        try:
            inventory = cluster.write_inventory(Path("/tmp/meshrun-bench-wan.yaml"))
            plan = [(p, far_methods if p == "far" else methods) for p in ["lan", *profiles]]
            runs = run_all(cluster, inventory, plan, args.epochs, args.none_to_target, lambda run: (
                f"comm {run.comm_s * 1e3:7.1f} ms, step {run.step_s * 1e3:7.1f} ms, to {TARGET:.2f}: "
                f"{run.time_to_target} (epoch {run.hit_epoch}), final {run.final_acc:.4f}, "
                f"{run.bytes_per_step / 1e3:.0f} kB/step/host ({run.wall_s:.0f} s)"))
        finally:
            cluster.down()
    print(f"bench total {time.time() - started:.0f} s")
    report(runs, methods, profiles)
    return 0


def run_all(cluster: SimCluster, inventory: Path, plan: list[tuple[str, list[str]]], epochs: int,
            none_to_target: bool, show: Callable[[Run], str],
            extra: Callable[[str, str], Sequence[str]] = lambda profile, method: (), hosts: int = HOSTS,
            synced: bool = False) -> list[Run]:
    """Each (profile, its methods) in order, lan first: off lan a method stops at the epoch where
    its lan run reached the target; `none` off lan runs P2_ONLY_STEPS unless `none_to_target`.
    `extra(profile, method)`: more flags for that run (`one_run`); `synced`: an earlier call's first
    run already synced the code (every later run passes `--no-sync`)."""
    runs: list[Run] = []
    hit_epoch: dict[str, int] = {}
    for profile, methods in plan:
        for method in methods:
            count, steps = (epochs if profile == "lan" else hit_epoch.get(method, epochs)), STEPS_PER_EPOCH
            if profile != "lan" and method == "none" and not none_to_target:
                count, steps = 1, P2_ONLY_STEPS
            with cluster.profile(profile):
                run = one_run(cluster, inventory, method, profile, count, first=not runs and not synced,
                              steps_per_epoch=steps,
                              extra=extra(profile, method), hosts=hosts)
            runs.append(run)
            if profile == "lan" and run.hit_epoch is not None:
                hit_epoch[method] = run.hit_epoch
            print(f"  {profile:>8} {method:>14}: {show(run)}", flush=True)
    return runs


def floor_of(method: str, profile: str) -> tuple[float, float]:
    """(floor s, its latency part s) per step for `method` on `profile` (commplan's model)."""
    p = lookup(profile)
    rate = p.rate_mbit * 1e6 / 8 if p.rate_mbit else 10e9 / 8
    f = hook_floor(Hook(method), SHAPES, SETTINGS, HOSTS, rate, p.rtt_ms / 1e3)
    return f.floor_s, f.latency_s


def report(runs: list[Run], methods: list[str], profiles: list[str]) -> None:
    by = {(r.shape, r.hook): r for r in runs}
    full = hook_bytes(Hook.NONE, SHAPES, SETTINGS)
    print(f"\nP2: all-reduce per step ÷ its floor (bandwidth + latency), hook none, {HOSTS} hosts, "
          f"S = {full / 1e6:.2f} MB (goal <= 1.3 on home)")
    print(f"{'profile':>7}  {'measured ms':>11}  {'floor ms':>8}  {'of it latency ms':>16}  {'ratio':>5}")
    for profile in profiles:
        r = by.get((profile, "none"))
        if r is not None:
            floor, latency = floor_of("none", profile)
            print(f"{profile:>7}  {r.comm_s * 1e3:>11.1f}  {floor * 1e3:>8.1f}  {latency * 1e3:>16.1f}  "
                  f"{r.comm_s / floor:>5.2f}")
    base = by.get(("lan", "none"))
    best: tuple[float, str] | None = None
    for profile in profiles:
        print(f"\nP3: time to test accuracy {TARGET:.2f}, {profile} ÷ lan (goal <= 1.3 for the best method)")
        print(f"{'method':>14}  {'lan s':>6}  {profile + ' s':>7}  {'ratio':>5}  {'steps':>5}  {'final acc':>9}  "
              f"{'Δ vs none':>9}  {'comm ms':>7}  {'floor ms':>8}  {'kB/step':>7}  {'model kB':>8}")
        for method in methods:
            a, b = by.get(("lan", method)), by.get((profile, method))
            if a is None or b is None:
                continue
            ratio = b.time_to_target / a.time_to_target if a.time_to_target and b.time_to_target else None
            delta = (a.final_acc - base.final_acc) * 100 if base else float("nan")
            steps = (a.hit_epoch or 0) * a.steps // max(1, a.epochs_run)
            model = 2 * (HOSTS - 1) / HOSTS * hook_bytes(Hook(method), SHAPES, SETTINGS)
            fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
            print(f"{method:>14}  {fmt(a.time_to_target):>6}  {fmt(b.time_to_target):>7}  "
                  f"{(f'{ratio:.2f}' if ratio else '-'):>5}  {steps:>5}  {a.final_acc:>9.4f}  {delta:>+8.1f}p  "
                  f"{b.comm_s * 1e3:>7.1f}  {floor_of(method, profile)[0] * 1e3:>8.1f}  "
                  f"{b.bytes_per_step / 1e3:>7.0f}  {model / 1e3:>8.0f}")
            if profile == "home" and ratio is not None and delta >= -1.0 and (best is None or ratio < best[0]):
                best = (ratio, method)
    print("steps: optimizer steps to the target on lan; final acc: after all epochs on lan; comm ms: the trainer's "
          "probe (past the hook's warm-up); floor: commplan's 2(N-1)/N x S_hook / B + latency per step")
    print("kB/step: measured eth0 tx bytes per host per optimizer step (training phase, incl. eval and logs); "
          "model kB: 2(N-1)/N x S_hook (the periodic methods amortized over their period)")
    print(f"P3 best: {best[1]} {best[0]:.2f}" if best else "P3 best: - nan")


if __name__ == "__main__":
    sys.exit(main())
