"""Step timing, peak memory, and the gradient-communication probe.

Timing contract: on CUDA, the device is synchronized at each timing boundary of a *recorded*
step (every ``perf.every_steps``), so the numbers are device time rather than kernel-launch
time; unrecorded steps run without extra synchronization. On CPU no synchronization is needed.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass

import torch

from train.loop import StepParts, forward_backward


@dataclass(frozen=True)
class PeakMemory:
    bytes: int
    kind: str  # "cuda" (max allocated) or "rss" (max resident set size of the process)


def peak_memory(device: torch.device) -> PeakMemory:
    if device.type == "cuda":
        return PeakMemory(torch.cuda.max_memory_allocated(device), "cuda")
    return PeakMemory(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class CommEstimate:
    method: str
    steps: int
    sync_s: float
    no_sync_s: float

    @property
    def comm_s(self) -> float:
        return max(self.sync_s - self.no_sync_s, 0.0)


METHOD = "median fwd+bwd time with DDP gradient sync minus median under no_sync, same batch"


def probe_comm(parts: StepParts, batch: tuple[torch.Tensor, ...], steps: int) -> CommEstimate:
    """Time ``steps`` forward+backward passes on one batch with and without DDP's gradient
    all-reduce, interleaved to cancel drift. Collective: all ranks must call it together.
    Leaves parameters, buffers (e.g. BatchNorm statistics), gradients and the RNG as found."""
    module = parts.model.module if hasattr(parts.model, "module") else parts.model
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    rng = torch.get_rng_state()
    x, y, w = (t.to(parts.device) for t in batch)
    timed = {True: [], False: []}
    for _ in range(steps):
        for sync_grads in (True, False):
            sync(parts.device)
            start = time.perf_counter()
            forward_backward(parts, x, y, w, 1.0, sync_grads)
            sync(parts.device)
            timed[sync_grads].append(time.perf_counter() - start)
            parts.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    torch.set_rng_state(rng)
    return CommEstimate(METHOD, steps, statistics.median(timed[True]),
                        statistics.median(timed[False]))


class Stopwatch:
    """Monotonic lap timer; ``lap()`` returns seconds since the previous lap."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed
