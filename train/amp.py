"""Mixed precision (``amp: off|bf16|fp16``): each rank's autocast dtype, and the fp16 loss scaler,
decided for the whole job.

Contract:
- ``amp_dtype(precision, device)``: what this rank autocasts to: bf16 or fp16 on CUDA; None (full
  precision) on CPU, where the config value is ignored.
- ``job_scaler(precision, dtype, device)``: collective under ``amp: fp16`` (the config is the same
  on every rank, so every rank calls it or none does). A ``GradScaler`` on *every* rank when at
  least one rank of the job autocasts to fp16, on none otherwise; never decided by a rank's own
  device. DDP averages the gradients as they leave backward: a GPU rank's are S times the true
  gradient (S: the scale), so a CPU rank must send S times its own too and unscale the same sum by
  the same S, or after one step the replicas differ (the CPU ranks' share shrunk S-fold on the
  GPU ranks, the GPU ranks' grown S-fold on the CPU ranks) and DDP never brings them back. The CPU
  rank's scaling is exact: S is a power of two, and fp32 gradients scaled and unscaled by it come
  back bit for bit. An overflow (a GPU rank's fp16 inf) reaches every rank through the same
  all-reduced gradients, so every scaler skips the same step and keeps the same scale.
- ``cpu_note(...)``: the one line a rank that ignores ``amp`` prints (every such rank, on its own
  output: rank 0 may well be a GPU rank with nothing to say).
"""

from __future__ import annotations

import torch

from meshrun.train import dist
from meshrun.train.config import Precision


def amp_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """AMP only on CUDA; on CPU the config value is ignored (and announced by ``cpu_note``)."""
    if device.type != "cuda" or precision is Precision.OFF:
        return None
    return torch.bfloat16 if precision is Precision.BF16 else torch.float16


def job_scaler(precision: Precision, dtype: torch.dtype | None,
               device: torch.device) -> torch.amp.GradScaler | None:
    """Collective under fp16 (see the module docstring): a scaler on every rank or on none."""
    if precision is not Precision.FP16:
        return None
    fp16_ranks = sum(dist.all_gather_ints(int(dtype is torch.float16), device))
    return torch.amp.GradScaler(device.type) if fp16_ranks else None


def cpu_note(precision: Precision, dtype: torch.dtype | None, scaled: bool, rank: int,
             host: str) -> str | None:
    """The line a rank that ignores ``amp`` prints, or None when it autocasts as configured."""
    if precision is Precision.OFF or dtype is not None:
        return None
    where = f"rank {rank}" + (f" on {host}" if host else "")
    text = f"amp={precision.value} ignored: AMP runs only on CUDA; {where} trains in full precision"
    if scaled:
        text += (", its loss scaled like the fp16 GPU ranks' (GradScaler), so that every replica "
                 "takes the same step")
    return text


def setup(precision: Precision, dtype: torch.dtype | None, device: torch.device, rank: int,
          host: str) -> torch.amp.GradScaler | None:
    """The job's scaler (collective under fp16); a rank that ignores ``amp`` says so on stdout."""
    scaler = job_scaler(precision, dtype, device)
    note = cpu_note(precision, dtype, scaler is not None, rank, host)
    if note is not None:
        print(note, flush=True)
    return scaler
