"""One training step and exact evaluation; both take explicit objects and no config.

Losses are per-sample cross-entropy multiplied by the sampler's weights and summed (see
``train.sampler``), so padded slots count for nothing and the DDP gradient equals the gradient
of the mean over the global step's real samples.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from train import dist


@dataclass(frozen=True)
class StepParts:
    model: nn.Module  # DDP-wrapped when a process group exists
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16 only
    autocast_dtype: torch.dtype | None  # None: full precision
    device: torch.device
    grad_clip: float


@dataclass(frozen=True)
class EvalResult:
    loss: float
    top1: float  # fraction 0..1
    top5: float
    count: int


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def forward_backward(parts: StepParts, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                     scale: float, sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate gradients of ``scale * sum(w * loss)``; ``sync=False`` skips DDP's all-reduce
    (gradient accumulation). Returns the detached real-sample loss sum and real-sample count,
    left on the device so the caller decides when to synchronize."""
    skip = parts.model.no_sync() if not sync and hasattr(parts.model, "no_sync") else None
    with skip or contextlib.nullcontext():
        with autocast(parts.device, parts.autocast_dtype):
            logits = parts.model(x)
        per_sample = F.cross_entropy(logits.float(), y, reduction="none")
        loss = (per_sample * w).sum() * scale
        (parts.scaler.scale(loss) if parts.scaler else loss).backward()
    real = (w > 0).to(per_sample.dtype)
    return (per_sample.detach() * real).sum(), real.sum()


def optimizer_step(parts: StepParts) -> None:
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.optimizer)
    if parts.grad_clip > 0:
        nn.utils.clip_grad_norm_(parts.model.parameters(), parts.grad_clip)
    if parts.scaler is not None:
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
    else:
        parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def evaluate(module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device, autocast_dtype: torch.dtype | None) -> EvalResult:
    """Loss/top-1/top-5 over this rank's shard, summed over all ranks. Pass the *unwrapped*
    module: DDP's forward may broadcast buffers, and shards can differ in batch count."""
    was_training = module.training
    module.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, autocast_dtype):
            logits = module(x).float()
        k = min(5, logits.shape[1])
        hits = logits.topk(k, dim=1).indices.eq(y.unsqueeze(1))
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum").double(),
                             hits[:, 0].sum().double(), hits.any(dim=1).sum().double(),
                             torch.tensor(float(len(y)), dtype=torch.float64, device=device)])
    dist.all_reduce_sum(sums)
    module.train(was_training)
    loss, top1, top5, count = sums.tolist()
    if count == 0:
        return EvalResult(loss=float("nan"), top1=0.0, top5=0.0, count=0)
    return EvalResult(loss=loss / count, top1=top1 / count, top5=top5 / count, count=int(count))
