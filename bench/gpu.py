"""P7 (GPU): what meshrun's trainer gets out of one GPU, in under 5 minutes.

Measured in one invocation, on the first visible GPU:
  1. the matmul ceiling: bf16 TFLOP/s of a large square matmul (the most this GPU can do);
  2. `python -m meshrun.train` (torchrun, 1 process, NCCL) on ResNet-18 with the small-image stem, 32x32
     synthetic images, bf16 AMP, batch 256: samples/s of its best epoch after the first;
  3. a seed-style hand-written DDP loop (torchrun, 1 process, NCCL, torch.autocast bf16) on the
     same model, data and batch: samples/s of its best epoch after the first;
  4. the `CUDA_VISIBLE_DEVICES` path: a process started by torchrun with CUDA_VISIBLE_DEVICES=<last
     GPU>, as meshrun starts every host, sees exactly one device, `cuda:0`, and NCCL initialises and
     all-reduces at world size 1 (exit status 1 when either is wrong).
The table ends with `P7 RATIO`: trainer samples/s ÷ hand loop samples/s (goal >= 0.97), and the
trainer's model FLOP/s as a share of the matmul ceiling.

Usage (needs CUDA): python bench/gpu.py [--epochs 3] [--samples 20000] [--batch 256]
Without a GPU it says so and exits with status 2 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# ResNet-18 (small stem) forward on 3x32x32: about 0.56 GFLOP; training ~3x that.
RESNET18_SMALL_TRAIN_FLOP = 3 * 0.56e9


def matmul_ceiling(size: int = 8192, repeats: int = 50) -> float:
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def seed_style_worker(samples: int, epochs: int, batch: int, out: Path) -> None:
    """The hand loop (seed 000 style) on CUDA with NCCL and bf16 autocast."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshrun.train.config import ModelConfig
    from meshrun.train.data.synthetic import SyntheticImages
    from meshrun.train.kinds import ModelKind
    from meshrun.train.models import build_model

    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    data = SyntheticImages(samples, 10, 32, 0, 0)
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler, num_workers=4, pin_memory=True)
    model = build_model(ModelConfig(name=ModelKind.TORCHVISION, arch="resnet18", small_stem=True), 10,
                        (3, 32, 32)).cuda()
    model = DDP(model, device_ids=[local])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_func = torch.nn.CrossEntropyLoss()
    rates = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_func(model(x), y)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        if epoch > 0:
            rates.append(len(sampler) * dist.get_world_size() / (time.perf_counter() - start))
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"epoch_samples_per_s": rates}))
    dist.destroy_process_group()


def run_trainer(samples: int, epochs: int, batch: int, gpu: str, workdir: Path,
                cpu_smoke: bool = False) -> tuple[float, str]:
    """Best epoch samples/s of `python -m meshrun.train`, and its log (`cpu_smoke`: gloo, fp32, on CPU —
    only to check this script's plumbing on a machine without a GPU)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "MESHRUN_RUN_ID": "gpu-bench"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "meshrun.train",
            "--config", str(REPO / "train/configs/cifar10_resnet18.yaml"), "data.name=synthetic_images",
            f"data.train_size={samples}", "data.test_size=1000", f"data.batch_size={batch}", f"epochs={epochs}",
            "amp=bf16", "data.num_workers=4", "checkpoint.every_steps=0", "dist.backend=nccl"]
    if cpu_smoke:
        argv[-4:] = ["amp=off", "data.num_workers=0", "checkpoint.every_steps=0", "dist.backend=gloo"]
    done = subprocess.run(argv, cwd=workdir, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=240)
    if done.returncode != 0:
        raise SystemExit(f"gpu bench: the trainer failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (workdir / "runs/gpu-bench/metrics.jsonl").read_text().splitlines()]
    epochs_rows = [r for r in rows if r.get("kind") == "epoch" and r["epoch"] > 1]
    rates = [sum(r["rank_samples"]) / r["train_seconds"] for r in epochs_rows if r.get("train_seconds")]
    return max(rates), done.stdout + done.stderr


VISIBLE_PROBE = """import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
x = torch.ones(1, device="cuda:0")
dist.all_reduce(x)
print("PROBE", torch.cuda.device_count(), torch.cuda.current_device(), x.item(), dist.get_backend(), flush=True)
dist.destroy_process_group()
"""


def visible_device_checks(gpu: str, workdir: Path) -> dict[str, bool]:
    """CUDA_VISIBLE_DEVICES=<gpu> leaves exactly one device, cuda:0, and NCCL initialises and
    all-reduces at world size 1 under torchrun, as meshrun starts every host."""
    script = workdir / "visible_probe.py"
    script.write_text(VISIBLE_PROBE)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(script)], env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}, capture_output=True,
                          text=True, timeout=120)
    fields = next((line.split() for line in done.stdout.splitlines() if line.startswith("PROBE")), [])
    return {"one visible device, cuda:0": fields[1:3] == ["1", "0"],
            "NCCL init + all-reduce at world size 1": fields[3:5] == ["1.0", "nccl"]}


def run_seed(samples: int, epochs: int, batch: int, gpu: str, workdir: Path) -> float:
    out = workdir / "seed.json"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from bench.gpu import seed_style_worker; "
            f"from pathlib import Path; seed_style_worker({samples}, {epochs}, {batch}, Path({str(out)!r}))")
    script = workdir / "seed_main.py"
    script.write_text(code + "\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                    str(script)], cwd=workdir, env=env, check=True, capture_output=True, timeout=240)
    return max(json.loads(out.read_text())["epoch_samples_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--cpu-smoke", action="store_true", help="check the trainer plumbing on CPU (no figures)")
    args = parser.parse_args()
    import torch

    if args.cpu_smoke:
        with tempfile.TemporaryDirectory() as tmp:
            rate, _ = run_trainer(args.samples, args.epochs, args.batch, "", Path(tmp), cpu_smoke=True)
        print(f"cpu smoke: trainer {rate:.0f} samples/s (plumbing only, not P7)")
        return 0

    if not torch.cuda.is_available():
        print("gpu bench: no CUDA device here; run it on a machine with a GPU (nothing measured)")
        return 2
    count = torch.cuda.device_count()
    gpu = str(count - 1)  # the last GPU: CUDA_VISIBLE_DEVICES must remap it to cuda:0
    name = torch.cuda.get_device_name(count - 1)
    ceiling = matmul_ceiling()
    with tempfile.TemporaryDirectory() as tmp:
        checks = visible_device_checks(gpu, Path(tmp))
        trainer, _ = run_trainer(args.samples, args.epochs, args.batch, gpu, Path(tmp))
        seed = run_seed(args.samples, args.epochs, args.batch, gpu, Path(tmp))
    achieved = trainer * RESNET18_SMALL_TRAIN_FLOP
    print(f"{'GPU':>10}  {name} (CUDA_VISIBLE_DEVICES={gpu})")
    print(f"{'matmul':>10}  {ceiling / 1e12:8.1f} TFLOP/s bf16 ceiling")
    print(f"{'trainer':>10}  {trainer:8.0f} samples/s  ({achieved / 1e12:.1f} TFLOP/s, "
          f"{achieved / ceiling:.0%} of the ceiling)")
    print(f"{'hand loop':>10}  {seed:8.0f} samples/s")
    for what, ok in checks.items():
        print(f"{'check':>10}  {what}: {'ok' if ok else 'FAILED'}")
    print(f"P7 {trainer / seed:.2f}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
