"""Per-rank batch sizes: from the inventory (``MESHRUN_BATCH_SIZE``), the config, or a probe.

Contract:
- ``resolve_batch_sizes`` is collective (every rank calls it once, before training) and returns
  the same ``BatchPlan`` on every rank.
- A rank's request is an int (its host's inventory ``batch_size``), nothing (the config's
  ``data.batch_size``) or ``auto``.
- When any rank asks for ``auto``, the global batch is ``data.global_batch_size`` (0: world size
  x ``data.batch_size``). The auto ranks share what the fixed ranks leave of it, in proportion
  to the samples/s each measured in ``probe_throughput``, each at least 1 and at most its memory
  cap (``allocate``). Too little memory in total is a ``UsageError``.
- The probe runs under the training's autocast dtype (its speed and memory are the training's),
  and on CUDA its cap leaves room for what training holds beside the probe's own peak
  (``later_bytes``: optimizer moments, DDP's buckets, an outer hook's copies), out of the memory
  free when it starts (another process's share of the GPU is not ours).
"""

from __future__ import annotations

import dataclasses

import enum
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from meshrun.train import dist
from meshrun.train.config import (AutoBatchConfig, CommConfig, CommHook, DataConfig, OptimConfig,
                                  OptimizerKind, WireDtype)
from meshrun.train.dist import DistEnv
from meshrun.train.errors import UsageError
from meshrun.train.loop import autocast
from meshrun.train.perf import kept_rng
from meshrun.train.sampler import proportional_split

BatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


class BatchSource(str, enum.Enum):
    CONFIG = "config"  # data.batch_size
    INVENTORY = "inventory"  # the host's batch_size: N
    AUTO = "auto"  # the host's batch_size: auto, sized by the probe


@dataclass(frozen=True)
class ProbeResult:
    """One rank's probe: median forward+backward seconds per batch size tried."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    samples_per_s: float  # best sizes[i] / seconds[i]
    max_batch: int  # memory cap in samples; 0: no cap
    memory: str  # how the cap was found


@dataclass(frozen=True)
class BatchPlan:
    sizes: tuple[int, ...]  # per rank
    hosts: tuple[str, ...]  # per rank
    sources: tuple[BatchSource, ...]  # per rank
    probes: tuple[ProbeResult | None, ...]  # per rank (None: not probed)

    @property
    def global_batch(self) -> int:
        return sum(self.sizes)

    def describe(self) -> str:
        parts = []
        for rank, (size, host, probe) in enumerate(zip(self.sizes, self.hosts, self.probes)):
            extra = "" if probe is None else (
                f" (probe {probe.samples_per_s:.0f} samples/s, cap "
                f"{probe.max_batch or 'none'})")
            parts.append(f"{host or 'local'}/r{rank} {size}{extra}")
        kinds = "+".join(sorted({s.value for s in self.sources}))
        return f"batch sizes ({kinds}, global {self.global_batch}): " + ", ".join(parts)


@dataclass(frozen=True)
class _Request:
    host: str
    fixed: int | None
    auto: bool


def host_label(host: object) -> str:
    """A rank's host as it says it (its MESHRUN_HOST), as rank 0 prints and records it: printable
    ASCII, clipped (dist's label for peer text). An inventory name passes unchanged; a newline or an
    ESC from a hostile rank could otherwise forge whole lines in rank 0's log and metrics."""
    if not isinstance(host, str):
        return "?"
    return dist._label(host) or ("?" if host else "")  # "": the local host, which says no name


def allocate(total: int, speeds: Sequence[float], caps: Sequence[int]) -> list[int]:
    """``total`` samples over ranks in proportion to ``speeds``: each gets at least 1 and at most
    its cap (0: none); a capped rank's excess goes to the others in the same proportions."""
    n = len(speeds)
    if total < n:
        raise UsageError(f"global batch {total} is smaller than the {n} auto-sized ranks; "
                         f"raise data.global_batch_size")
    limited = sum(c if c else total for c in caps)
    if limited < total:
        raise UsageError(f"global batch {total} does not fit in the ranks' memory caps "
                         f"{list(caps)} (sum {limited}); lower data.global_batch_size or raise "
                         f"autobatch.cpu_memory_mb / autobatch.cuda_memory_fraction")
    sizes: dict[int, int] = {}
    while True:
        free = [i for i in range(n) if i not in sizes]
        shares = _at_least_one(proportional_split(total - sum(sizes.values()),
                                                  [max(speeds[i], 1e-9) for i in free]))
        over = [i for i, s in zip(free, shares) if caps[i] and s > caps[i]]
        if not over:
            sizes.update(zip(free, shares))
            return [sizes[i] for i in range(n)]
        sizes.update({i: caps[i] for i in over})


def _at_least_one(shares: list[int]) -> list[int]:
    """A rank too slow for a whole sample still gets 1, taken from the largest share."""
    shares = list(shares)
    for i, share in enumerate(shares):
        if share == 0:
            shares[shares.index(max(shares))] -= 1
            shares[i] = 1
    return shares


def probe_sizes(cfg: AutoBatchConfig, share: int) -> tuple[int, ...]:
    if cfg.probe_sizes:
        return tuple(sorted(set(cfg.probe_sizes)))
    return tuple(sorted({max(1, share // 2), share, 2 * share}))


def later_copies(optim: OptimConfig, comm: CommConfig, distributed: bool) -> float:
    """What training holds beside a fwd+bwd, in parameter sizes (P), that the probe does not:
    the optimizer's moments (AdamW 2, SGD with momentum 1; created at its first step), DDP's
    gradient buckets (1: ``gradient_as_bucket_view`` is off), PowerSGD's error feedback (1: one
    tensor per bucket; its P and Q memories, low-rank, are not counted), an outer hook's copies
    (``train.diloco``): the anchor, the outer momentum, and overlapped the pending reduced round
    plus, on a bf16 wire, its narrow copy in flight (0.5). A round's end and a save hold more
    for a moment, but without a batch's activations, the bulk of what the probe measures."""
    moments = 2.0 if optim.name is OptimizerKind.ADAMW else 1.0 if optim.momentum > 0 else 0.0
    copies = moments + (1.0 if distributed else 0.0)
    if distributed and comm.hook is CommHook.POWERSGD:
        copies += 1.0
    if distributed and comm.hook in (CommHook.DILOCO, CommHook.DILOCO_OVERLAP, CommHook.HIER):
        copies += 1.0 + (1.0 if comm.diloco_outer_momentum > 0 else 0.0)
        if comm.hook is not CommHook.DILOCO:  # overlapped: diloco-overlap, and hier between sites
            copies += 1.0 + (0.5 if comm.diloco_wire_dtype is WireDtype.BF16 else 0.0)
    return copies


def later_bytes(module: nn.Module, optimizer: torch.optim.Optimizer, optim: OptimConfig,
                comm: CommConfig) -> int:
    """``later_copies`` in bytes, less the optimizer state already held (a resume loads it before
    the probe, whose peak then counts it)."""
    params = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)
    moments = later_copies(optim, comm, False) * params  # without a process group: these alone
    rest = (later_copies(optim, comm, dist.active()) * params) - moments
    return int(max(0.0, moments - held) + rest)


def resolve_batch_sizes(env: DistEnv, data: DataConfig, auto: AutoBatchConfig,
                        module: nn.Module, batch_fn: BatchFn, device: torch.device,
                        dtype: torch.dtype | None = None, later: int = 0) -> BatchPlan:
    """Collective: gather every rank's request, probe if any asked for ``auto``, allocate.
    ``dtype``: the training's autocast dtype; ``later``: ``later_bytes``."""
    mine = _Request(env.host, env.batch_size, env.batch_auto)
    # Plain dicts across ranks (dist.all_gather_objects loads no classes), rebuilt here.
    requests = [_Request(**r) for r in dist.all_gather_objects(dataclasses.asdict(mine))]
    sources = tuple(BatchSource.AUTO if r.auto else BatchSource.INVENTORY if r.fixed
                    else BatchSource.CONFIG for r in requests)
    sizes = [r.fixed or data.batch_size for r in requests]
    hosts = tuple(host_label(r.host) for r in requests)
    if not any(r.auto for r in requests):
        return BatchPlan(tuple(sizes), hosts, sources, (None,) * len(requests))
    total = data.global_batch_size or len(requests) * data.batch_size
    auto_ranks = [i for i, r in enumerate(requests) if r.auto]
    left = total - sum(s for i, s in enumerate(sizes) if i not in auto_ranks)
    share = max(1, math.ceil(left / len(auto_ranks)))
    probe = probe_throughput(module, batch_fn, device, probe_sizes(auto, share), auto, dtype,
                             later) if mine.auto else None
    probes: list[ProbeResult | None] = [
        ProbeResult(**p) if p is not None else None
        for p in dist.all_gather_objects(dataclasses.asdict(probe) if probe is not None else None)]
    measured = [p for i, p in enumerate(probes) if i in auto_ranks and p is not None]
    chosen = allocate(left, [p.samples_per_s for p in measured], [p.max_batch for p in measured])
    for i, size in zip(auto_ranks, chosen):
        sizes[i] = size
    return BatchPlan(tuple(sizes), hosts, sources, tuple(probes))


def probe_throughput(module: nn.Module, batch_fn: BatchFn, device: torch.device,
                     sizes: Sequence[int], cfg: AutoBatchConfig, dtype: torch.dtype | None = None,
                     later: int = 0) -> ProbeResult:
    """Time forward+backward (no gradient sync, under ``dtype`` autocast as training runs) at
    each size, smallest first, and derive the memory cap. Leaves parameters, buffers, gradients
    and the RNG (the CPU's and, once CUDA is initialised, the GPUs': ``perf.kept_rng``) as found."""
    with kept_rng():
        return _probe(module, batch_fn, device, sizes, cfg, dtype, later)


def _probe(module: nn.Module, batch_fn: BatchFn, device: torch.device, sizes: Sequence[int],
           cfg: AutoBatchConfig, dtype: torch.dtype | None, later: int) -> ProbeResult:
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    was_training = module.training
    module.train()
    meter = _MemoryMeter(module, device, cfg, later)
    tried: list[int] = []
    seconds: list[float] = []
    memory: list[int] = []
    failed = 0  # smallest size that ran out of CUDA memory
    for size in sizes:
        if not meter.fits(size, tried, memory):
            break
        try:
            took, used = _time_size(module, batch_fn(size), device, cfg.probe_steps, meter, dtype)
        except torch.cuda.OutOfMemoryError:  # the probe's purpose: find where memory ends
            torch.cuda.empty_cache()
            failed = size
            break
        tried.append(size)
        seconds.append(took)
        memory.append(used)
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    module.train(was_training)
    if not tried:
        raise UsageError(f"batch_size auto: even a batch of {sizes[0]} does not fit in memory "
                         f"({meter.how}); set a smaller autobatch.probe_sizes")
    best = max(s / t for s, t in zip(tried, seconds))
    cap = meter.cap(tried, memory)
    if failed:
        cap = min(cap or failed - 1, failed - 1)
    return ProbeResult(tuple(tried), tuple(seconds), best, cap, meter.how)


def _time_size(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device,
               steps: int, meter: "_MemoryMeter", dtype: torch.dtype | None) -> tuple[float, int]:
    x, y = (t.to(device) for t in batch)
    times = []
    for rep in range(steps + 1):  # the first pass warms up allocator and kernels
        meter.start()
        _sync(device)
        began = time.perf_counter()
        with meter.saved_tensors():
            with autocast(device, dtype):  # the training's dtype: its speed and memory
                logits = module(x)
            loss = nn.functional.cross_entropy(logits.float(), y)  # as train.loop, in fp32
        loss.backward()
        _sync(device)
        if rep:
            times.append(time.perf_counter() - began)
        module.zero_grad(set_to_none=True)
    return statistics.median(times), meter.used()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _MemoryMeter:
    """Bytes one fwd+bwd needs. CUDA: the allocator's peak against what this process may use: a
    fraction of the device, or what is free now plus this process's own cache if less (other
    processes on the GPU), less ``later`` (``later_bytes``). CPU (RSS is no per-batch signal):
    bytes of tensors autograd saves for backward plus 4x the parameter bytes (weights, gradients,
    two optimizer moments), against a configured cap."""

    def __init__(self, module: nn.Module, device: torch.device, cfg: AutoBatchConfig,
                 later: int = 0) -> None:
        self.device, self.saved = device, 0
        self.fixed = 4 * sum(p.numel() * p.element_size() for p in module.parameters())
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
            room = min(int(total * cfg.cuda_memory_fraction), free)
            self.limit = max(room - later, 1)  # 0 would mean no cap
            self.how = (f"CUDA peak allocated vs {room >> 20} MiB ({cfg.cuda_memory_fraction:g} of "
                        f"{total >> 20} MiB, {free >> 20} MiB free) less {later >> 20} MiB of "
                        "optimizer, DDP and outer-hook state")
        else:
            self.limit = int(cfg.cpu_memory_mb * 2 ** 20)
            self.how = (f"saved activations + 4x parameters vs autobatch.cpu_memory_mb="
                        f"{cfg.cpu_memory_mb:g}" if self.limit else "no CPU cap configured")

    def start(self) -> None:
        self.saved = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def saved_tensors(self) -> torch.autograd.graph.saved_tensors_hooks:
        def pack(t: torch.Tensor) -> torch.Tensor:
            self.saved += t.numel() * t.element_size()
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def used(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return self.fixed + self.saved

    def fits(self, size: int, tried: list[int], memory: list[int]) -> bool:
        return not self.limit or len(tried) < 2 or _predict(size, tried, memory) <= self.limit

    def cap(self, tried: list[int], memory: list[int]) -> int:
        """Largest batch predicted to fit (linear in the batch size), 0 without a limit."""
        if not self.limit:
            return 0
        if len(tried) < 2:
            return tried[-1]  # the next size did not fit: what ran is all we know fits
        per_sample = max((memory[-1] - memory[-2]) / (tried[-1] - tried[-2]), 1e-9)
        return max(1, int((self.limit - (memory[-1] - per_sample * tried[-1])) // per_sample))


def _predict(size: int, tried: list[int], memory: list[int]) -> float:
    per_sample = (memory[-1] - memory[-2]) / (tried[-1] - tried[-2])
    return memory[-1] + per_sample * (size - tried[-1])
