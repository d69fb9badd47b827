"""P5: throughput of ``python -m meshrun.train`` against a minimal hand-written DDP loop (seed 000 style).

Both sides: 2 gloo processes under ``torchrun --standalone``, OMP_NUM_THREADS=1, the seed's
ToyModel, the same deterministic synthetic 3x32x32 images (train.data.synthetic), batch 32 per
process, SGD(lr 0.01, momentum 0.9), num_workers 0, ``EPOCHS`` epochs.

Measured: samples/s of each training epoch 2..EPOCHS (epoch 1 carries DDP's warm-up), all
ranks' samples together; a run's figure is its best such epoch (see ``Pair``). The trainer's
figure comes from its own epoch records (``train_seconds``, which covers data loading, steps,
per-step bookkeeping, step records, progress.json, the epoch's sample-weighted totals and
coverage all-reduce and any intra-epoch checkpoint, but not evaluation or the epoch-end
checkpoint); the hand loop times the same phase with perf_counter and does no evaluation.

Machine load (other jobs on the box) moves both sides, so the runs are interleaved in pairs
whose order alternates (seed, trainer), (trainer, seed), ...: a slow spell hits both sides of
a pair. Each pair gives a ratio trainer/seed; P5 is the median of the pair ratios, all
measured in this one invocation.

Usage: python bench/trainer_overhead.py [--repeats 7] [--samples 8192] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH, LR, MOMENTUM = 32, 0.01, 0.9


def seed_style_worker(samples: int, epochs: int, out: Path) -> None:
    """The hand-written loop, as in seed 000 (DistributedSampler, set_epoch, rank-0 save)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshrun.train.data.synthetic import SyntheticImages
    from meshrun.train.models.toy import ToyModel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1 + rank)
    data = SyntheticImages(samples, 10, 32, 0, 0)
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_func = torch.nn.CrossEntropyLoss()
    rates = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_func(model(x), y)
            loss.backward()
            optimizer.step()
        if epoch > 0:
            rates.append(len(sampler) * dist.get_world_size() / (time.perf_counter() - start))
        if rank == 0:
            torch.save(model.module.state_dict(), out.parent / "seed.ckpt")
    if rank == 0:
        out.write_text(json.dumps({"epoch_samples_per_s": rates}))
    dist.destroy_process_group()


def torchrun(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           *args]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def run_trainer(samples: int, epochs: int, work: Path) -> list[float]:
    run = work / f"trainer-{time.monotonic_ns()}"
    torchrun(["-m", "meshrun.train", "--config", str(REPO / "train/configs/cifar10_toy.yaml"),
              "--run-dir", str(run), "data.name=synthetic_images", f"data.train_size={samples}",
              "data.test_size=512", f"data.batch_size={BATCH}", f"optim.lr={LR}",
              f"optim.momentum={MOMENTUM}", f"epochs={epochs}"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ends = [r for r in rows if r["kind"] == "epoch"]
    return [(b["samples_seen"] - a["samples_seen"]) / b["train_seconds"]
            for a, b in zip(ends, ends[1:])]


def run_seed_style(samples: int, epochs: int, work: Path) -> list[float]:
    out = work / f"seed-{time.monotonic_ns()}.json"
    torchrun([str(Path(__file__).resolve()), "--worker", str(out), "--samples", str(samples),
              "--epochs", str(epochs)])
    return json.loads(out.read_text())["epoch_samples_per_s"]


@dataclass(frozen=True)
class Pair:
    """One interleaved pair of runs; each side's figure is its best timed epoch (samples/s):
    other jobs on the machine only ever slow an epoch down, so the fastest epoch is the one
    least disturbed. ``*_mean`` keeps the plain mean over timed epochs for comparison."""

    index: int
    order: str
    trainer: float
    seed: float
    trainer_mean: float
    seed_mean: float

    @property
    def ratio(self) -> float:
        return self.trainer / self.seed

    @property
    def ratio_mean(self) -> float:
        return self.trainer_mean / self.seed_mean


def measure(repeats: int, samples: int, epochs: int, work: Path) -> list[Pair]:
    pairs = []
    for i in range(repeats):
        trainer_first = i % 2 == 1
        if trainer_first:
            trainer = run_trainer(samples, epochs, work)
            seed = run_seed_style(samples, epochs, work)
        else:
            seed = run_seed_style(samples, epochs, work)
            trainer = run_trainer(samples, epochs, work)
        pair = Pair(i + 1, "trainer,seed" if trainer_first else "seed,trainer", max(trainer),
                    max(seed), statistics.mean(trainer), statistics.mean(seed))
        print(f"  pair {pair.index}/{repeats}: ratio {pair.ratio:.3f}", file=sys.stderr, flush=True)
        pairs.append(pair)
    return pairs


def table(pairs: list[Pair], samples: int, epochs: int) -> str:
    rows = [f"P5: python -m meshrun.train vs seed-style DDP loop; 2 gloo processes, ToyModel, "
            f"{samples} synthetic 3x32x32 samples, batch {BATCH}/process, "
            f"epochs 2..{epochs} timed;",
            "samples/s of each run's best timed epoch (mean over timed epochs in the last column)",
            f"{'pair':>4}  {'order':<13} {'trainer samples/s':>18} {'seed samples/s':>15} "
            f"{'ratio':>6} {'ratio of means':>15}"]
    for p in pairs:
        rows.append(f"{p.index:>4}  {p.order:<13} {p.trainer:>18.1f} {p.seed:>15.1f} "
                    f"{p.ratio:>6.3f} {p.ratio_mean:>15.3f}")
    med = statistics.median
    rows.append(f"{'med':>4}  {'':<13} {med(p.trainer for p in pairs):>18.1f} "
                f"{med(p.seed for p in pairs):>15.1f} {med(p.ratio for p in pairs):>6.3f} "
                f"{med(p.ratio_mean for p in pairs):>15.3f}")
    ratios = sorted(p.ratio for p in pairs)
    rows.append(f"P5 = {med(ratios):.3f} (median of {len(pairs)} pair ratios; range "
                f"{ratios[0]:.3f}..{ratios[-1]:.3f}; goal >= 0.97)")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        seed_style_worker(args.samples, args.epochs, args.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        pairs = measure(args.repeats, args.samples, args.epochs, Path(tmp))
    print(table(pairs, args.samples, args.epochs))


if __name__ == "__main__":
    main()
