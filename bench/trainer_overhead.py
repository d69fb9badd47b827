"""P5: throughput of ``python -m train`` against a minimal hand-written DDP loop (seed 000 style).

Both sides: 2 gloo processes under ``torchrun --standalone``, OMP_NUM_THREADS=1, the seed's
ToyModel, the same deterministic synthetic 3x32x32 images (train.data.synthetic), batch 32 per
process, SGD(lr 0.01, momentum 0.9), num_workers 0, ``EPOCHS`` epochs.

Measured: samples/s over the training phase of epochs 2..EPOCHS (epoch 1 carries DDP's
warm-up), all ranks' samples together. The trainer's figure comes from its own epoch records
(``train_seconds``, which covers data loading, steps, per-step perf records, progress.json and
any intra-epoch checkpoint, but not evaluation or the epoch-end checkpoint); the hand loop times
the same phase with perf_counter and does no evaluation. Runs alternate to cancel drift; the
ratio printed is the median of per-pair ratios.

Usage: python bench/trainer_overhead.py [--repeats 3] [--samples 8192] [--epochs 3]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH, LR, MOMENTUM = 32, 0.01, 0.9


def seed_style_worker(samples: int, epochs: int, out: Path) -> None:
    """The hand-written loop, as in seed 000 (DistributedSampler, set_epoch, rank-0 save)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from train.data.synthetic import SyntheticImages
    from train.models.toy import ToyModel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1 + rank)
    data = SyntheticImages(samples, 10, 32, 0, 0)
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_func = torch.nn.CrossEntropyLoss()
    timed, seen = 0.0, 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_func(model(x), y)
            loss.backward()
            optimizer.step()
        if epoch > 0:
            timed += time.perf_counter() - start
            seen += len(sampler) * dist.get_world_size()
        if rank == 0:
            torch.save(model.module.state_dict(), out.parent / "seed.ckpt")
    if rank == 0:
        out.write_text(json.dumps({"samples_per_s": seen / timed}))
    dist.destroy_process_group()


def torchrun(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           *args]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def run_trainer(samples: int, epochs: int, work: Path) -> float:
    run = work / f"trainer-{time.monotonic_ns()}"
    torchrun(["-m", "train", "--config", str(REPO / "train/configs/cifar10_toy.yaml"),
              "--run-dir", str(run), "data.name=synthetic_images", f"data.train_size={samples}",
              "data.test_size=512", f"data.batch_size={BATCH}", f"optim.lr={LR}",
              f"optim.momentum={MOMENTUM}", f"epochs={epochs}"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs_rows = [r for r in rows if r["kind"] == "epoch"][1:]
    seen = sum(b["samples_seen"] - a["samples_seen"]
               for a, b in zip([r for r in rows if r["kind"] == "epoch"], epochs_rows))
    return seen / sum(r["train_seconds"] for r in epochs_rows)


def run_seed_style(samples: int, epochs: int, work: Path) -> float:
    out = work / f"seed-{time.monotonic_ns()}.json"
    torchrun([str(Path(__file__).resolve()), "--worker", str(out), "--samples", str(samples),
              "--epochs", str(epochs)])
    return json.loads(out.read_text())["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        seed_style_worker(args.samples, args.epochs, args.worker)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            seed = run_seed_style(args.samples, args.epochs, Path(tmp))
            trainer = run_trainer(args.samples, args.epochs, Path(tmp))
            rows.append((i + 1, trainer, seed, trainer / seed))
    print(f"{'run':>4} {'train samples/s':>16} {'seed-loop samples/s':>20} {'ratio':>7}")
    for i, trainer, seed, ratio in rows:
        print(f"{i:>4} {trainer:>16.1f} {seed:>20.1f} {ratio:>7.3f}")
    print(f"P5 (median ratio, goal >= 0.97): {statistics.median(r[3] for r in rows):.3f}")


if __name__ == "__main__":
    main()
