"""One training step and exact evaluation; both take explicit objects and no config.

Gradient contract (uneven per-rank batch sizes, gradient accumulation, any world size): each
rank sums the cross-entropy of its *real* samples (``train.sampler``: padding slots excluded)
and multiplies by ``world_size / R`` where ``R`` is the number of real samples of the whole
optimizer step (all ranks, all accumulated micro-steps). DDP averages over ranks (divides by
``world_size``), so the update uses ``sum(loss) / R``: the gradient of the global batch,
``g = sum_i b_i * mean_i / sum_i b_i``, whatever the per-rank sizes ``b_i``. Equivalently each
rank's *mean* loss is scaled by ``b_i * W / B``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from meshrun.train import dist
from meshrun.train.sampler import GlobalStep


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


@dataclass(frozen=True)
class MicroStep:
    """What one rank does with one sampler step."""

    real: int  # this rank's real samples (the batch's first ``real`` rows)
    scale: float  # world_size / real samples of the whole optimizer step
    sync: bool  # last micro-step of its optimizer step: DDP all-reduces, the optimizer steps
    window_real: int  # real samples of the whole optimizer step, all ranks


def micro_steps(steps: Sequence[GlobalStep], rank: int, accum: int,
                peers: Sequence[int] | None = None) -> list[MicroStep]:
    """Group the epoch's remaining steps into optimizer steps of ``accum`` micro-steps (the last
    one may be shorter) and give each micro-step its loss scale (see module docstring).
    ``peers``: the ranks DDP averages over when that is not every rank (``comm.hook=hier``: this
    rank's site), so the scale is ``len(peers) / their real samples``: the site's exact mean."""
    world = len(steps[0].per_rank) if steps else 1
    out = []
    for start in range(0, len(steps), accum):
        window = steps[start:start + accum]
        total = sum(s.real for s in window)
        scale = world / total
        if peers is not None:
            mine = sum(s.per_rank[r].real for s in window for r in peers)
            scale = len(peers) / mine if mine else 0.0
        for j, step in enumerate(window):
            out.append(MicroStep(step.per_rank[rank].real, scale, j == len(window) - 1, total))
    return out


def forward_backward(parts: StepParts, x: torch.Tensor, y: torch.Tensor, real: int,
                     scale: float, sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate gradients of ``scale * sum(loss of the first real rows)``; ``sync=False``
    skips DDP's all-reduce (gradient accumulation). Returns the detached real-sample loss sum
    and number of correct top-1 predictions, left on the device so the caller decides when to
    synchronize."""
    skip = parts.model.no_sync() if not sync and hasattr(parts.model, "no_sync") else None
    with skip or contextlib.nullcontext():
        with autocast(parts.device, parts.autocast_dtype):
            logits = parts.model(x)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if real < len(y):  # padding rows: computed (the step must run) but not counted
            logits, y = logits[:real], y[:real]
        loss_sum = F.cross_entropy(logits, y, reduction="sum")
        (parts.scaler.scale(loss_sum * scale) if parts.scaler else loss_sum * scale).backward()
    with torch.no_grad():
        correct = (logits.argmax(1) == y).sum()
    return loss_sum.detach(), correct


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
             device: torch.device, autocast_dtype: torch.dtype | None,
             sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] = dist.all_reduce_sum) -> EvalResult:
    """Loss/top-1/top-5 over this rank's shard, summed over all ranks (by ``sum_over_ranks``:
    hier's route between sites). Pass the *unwrapped* module: DDP's forward may broadcast
    buffers, and shards can differ in batch count."""
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
    sum_over_ranks(sums)
    module.train(was_training)
    loss, top1, top5, count = sums.tolist()
    if count == 0:
        return EvalResult(loss=float("nan"), top1=0.0, top5=0.0, count=0)
    return EvalResult(loss=loss / count, top1=top1 / count, top5=top5 / count, count=int(count))
