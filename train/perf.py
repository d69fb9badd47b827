"""Step timing, peak memory, and the gradient-communication probe.

Timing contract: see ``StepWindow``; on CPU no synchronization is needed. Peak memory on CUDA is
the allocator's since the epoch's training began (``StepWindow`` resets it), so neither the
``batch_size: auto`` probe's largest batch nor an evaluation shows in a step record.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from meshrun.train.loop import StepParts, forward_backward
from meshrun.train.metrics import StepRecord


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


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Run the body (a probe) and put the random generators back as found: the CPU's, and once
    CUDA is initialised every GPU's, which dropout on CUDA draws from and ``torch.get_rng_state``
    does not cover. An uninitialised CUDA stays so: a CPU rank on a GPU host would otherwise
    open a context, and take memory, on every GPU."""
    cpu = torch.get_rng_state()
    gpus = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if gpus is not None:
            torch.cuda.set_rng_state_all(gpus)


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
    Leaves parameters, buffers (e.g. BatchNorm statistics), gradients and the RNG (``kept_rng``)
    as found."""
    module = parts.model.module if hasattr(parts.model, "module") else parts.model
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    x, y = (t.to(parts.device) for t in batch[:2])
    timed: dict[bool, list[float]] = {True: [], False: []}
    with kept_rng():
        for _ in range(steps):
            for sync_grads in (True, False):
                sync(parts.device)
                start = time.perf_counter()
                forward_backward(parts, x, y, len(y), 1.0 / len(y), sync_grads)
                sync(parts.device)
                timed[sync_grads].append(time.perf_counter() - start)
                parts.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
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


class StepWindow:
    """Phase times of consecutive optimizer steps, emitted as one ``StepRecord`` per window.

    Per step it only adds to floats. On CPU every phase time is exact, and the record holds
    per-step means. On CUDA only the window's last step synchronizes at its phase boundaries (a
    sample of device time; the other steps run unsynchronized), so the record's phase split
    comes from that step while ``step_s`` and samples/s cover the whole window exactly.
    Made at each epoch's start, it resets the CUDA allocator's peak: its records report the
    training's peak, not the ``batch_size: auto`` probe's (its largest batch, often twice the
    training's) nor an evaluation's.
    """

    def __init__(self, device: torch.device, size: int) -> None:
        self.device, self.size = device, max(size, 1)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.watch = Stopwatch()
        self.reset()

    def reset(self) -> None:
        self.steps = self.samples = self.total_samples = 0
        self.sums = [0.0, 0.0, 0.0]  # data, fwd+bwd, optimizer over the window
        self.current = [0.0, 0.0, 0.0]  # the step in progress

    @property
    def sampling(self) -> bool:
        """The step in progress is the window's last (synchronized on CUDA)."""
        return self.steps + 1 >= self.size

    def data_ready(self) -> None:
        self.current[0] += self.watch.lap()

    def computed(self) -> None:
        if self.sampling:
            sync(self.device)
        self.current[1] += self.watch.lap()

    def stepped(self, mine: int, total: int) -> bool:
        """An optimizer step ended; True when the window is full and ``record`` is due."""
        if self.sampling:
            sync(self.device)
        self.current[2] += self.watch.lap()
        self.sums = [a + b for a, b in zip(self.sums, self.current)]
        self.steps, self.samples = self.steps + 1, self.samples + mine
        self.total_samples += total
        if self.steps < self.size:
            self.current = [0.0, 0.0, 0.0]
        return self.steps >= self.size

    def record(self, rank: int, host: str, epoch: int, global_step: int) -> StepRecord:
        """The window so far as one record (call after ``stepped``), then start a new one."""
        wall = sum(self.sums)
        n = max(self.steps, 1)
        phases = self.current if self.device.type == "cuda" else [v / n for v in self.sums]
        mem = peak_memory(self.device)
        out = StepRecord(rank, host, epoch, global_step, self.samples, phases[0], phases[1],
                         phases[2], wall / n, self.samples / wall if wall else 0.0,
                         self.total_samples / wall if wall else 0.0, mem.bytes, mem.kind,
                         time.time(), steps=self.steps)
        self.reset()
        return out
