"""Optimizer construction and the learning-rate schedule.

The schedule is a pure function of *fractional epoch* (epoch + consumed/epoch_size), not of the
step count, so it stays correct when a resume changes the world size (and so steps per epoch).
There is therefore no scheduler state to restore; checkpoints record the last LR for reference.
An optimizer step runs at the schedule's value where the step *begins* (``step_lr``), so a step
decay at epoch ``e`` applies from the first step of epoch ``e + 1`` (1-based) and every step of
an epoch before it runs at the old LR; only warmup is read at the step's end.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from meshrun.train.config import OptimConfig, OptimizerKind, ScheduleConfig, ScheduleKind


def build_optimizer(cfg: OptimConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.name is OptimizerKind.SGD:
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_at(cfg: ScheduleConfig, base_lr: float, progress: float, total_epochs: int) -> float:
    """LR after ``progress`` epochs of ``total_epochs``; warmup ramps linearly from 0."""
    if cfg.warmup_epochs > 0 and progress < cfg.warmup_epochs:
        return base_lr * progress / cfg.warmup_epochs
    if cfg.name is ScheduleKind.STEP:
        return base_lr * cfg.gamma ** int(progress // cfg.step_epochs)
    if cfg.name is ScheduleKind.COSINE:
        span = max(total_epochs - cfg.warmup_epochs, 1e-9)
        frac = min(max(progress - cfg.warmup_epochs, 0.0) / span, 1.0)
        return cfg.min_lr + (base_lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))
    return base_lr


def step_lr(cfg: ScheduleConfig, base_lr: float, start: float, end: float,
            total_epochs: int) -> float:
    """The LR of the optimizer step that trains from fractional epoch ``start`` to ``end``: the
    schedule at ``start``; a step that begins in the warmup takes the ramp at its end (capped at
    the warmup's end), or the first step of a run would train at LR 0."""
    if cfg.warmup_epochs > 0 and start < cfg.warmup_epochs:
        return lr_at(cfg, base_lr, min(end, cfg.warmup_epochs), total_epochs)
    return lr_at(cfg, base_lr, start, total_epochs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
