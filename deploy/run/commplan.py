"""Gradient communication plan, pure: bandwidth + round-trip time + nodes + gradient shapes →
floors → a hook.

The ring all-reduce floor of one collective is ``2(N-1)/N · S / B + 2(N-1) · RTT/2`` (N nodes, B
bytes/s per node, S the bytes each rank contributes): the bandwidth term, plus a latency term —
a ring all-reduce is 2(N-1) steps and each waits one one-way delay. DDP all-reduces each bucket
(``bucket_cap_mb``, 25 MB by default) on its own, so a step pays the latency term once per
bucket; PowerSGD pays it twice per bucket (its P and Q all-reduces). The floor per optimizer step
of a hook is its bandwidth term for S_hook plus its latency terms (docs/performance.md). S_hook is
estimated from the parameter shapes the trainer prints (``python -m meshrun.train --describe``):

- ``none``: S, the fp32 gradients (4 bytes per parameter);
- ``fp16`` / ``bf16``: S/2;
- ``powersgd``: torch's ``powerSGD_hook`` sends, per matrix of shape (n, m) (trailing dimensions
  flattened), P (n·r) and Q (m·r) with r = min(rank, n, m), but only when
  ``(n+m)·r·2 < n·m`` (torch's ``min_compression_rate`` 2); other tensors go uncompressed;
- ``localsgd``: S every ``period`` steps, so S/period amortized (after the warm-up), latency too;
- ``diloco`` / ``diloco-overlap``: one all-reduce of the pseudo-gradient (S) every H inner steps,
  so S/H and its latency amortized; the overlapped variant can also hide it behind the next round.

The recommendation is the most exact hook whose floor fits the budget per step (default
``DEFAULT_BUDGET_S``), in the order none, fp16, powersgd, localsgd, diloco; when none fits, the
hook with the lowest floor. Nothing here touches the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

DEFAULT_BUDGET_S = 0.05  # communication per step we accept without compressing further
DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
GRAD_BYTES = 4  # fp32 gradients: DDP reduces in the parameters' dtype
MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


class Hook(str, Enum):
    """The trainer's ``comm.hook`` values (train/config.py ``CommHook``)."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    LOCALSGD = "localsgd"
    DILOCO = "diloco"
    DILOCO_OVERLAP = "diloco-overlap"


PREFERENCE = (Hook.NONE, Hook.FP16, Hook.POWERSGD, Hook.LOCALSGD, Hook.DILOCO)  # most exact first


@dataclass(frozen=True)
class HookSettings:
    powersgd_rank: int = 4
    localsgd_period: int = 4
    diloco_inner_steps: int = 8
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class HookFloor:
    hook: Hook
    bytes_per_step: float  # S_hook: what each rank contributes to the all-reduce per step
    floor_s: float  # ring all-reduce floor per step at the measured bandwidth and RTT
    latency_s: float = 0.0  # the part of floor_s that is latency (RTT-bound ring steps)


@dataclass(frozen=True)
class CommPlan:
    nodes: int
    bandwidth_bytes_s: float
    rtt_s: float
    gradient_bytes: int
    budget_s: float
    floors: tuple[HookFloor, ...]
    recommended: Hook
    reason: str

    def floor_of(self, hook: Hook) -> HookFloor:
        return next(f for f in self.floors if f.hook is hook)


def ring_floor_s(nbytes: float, nodes: int, bandwidth_bytes_s: float) -> float:
    """``2(N-1)/N · S / B``: what a ring all-reduce must move through each node's link."""
    if nodes <= 1:
        return 0.0
    return 2 * (nodes - 1) / nodes * nbytes / bandwidth_bytes_s


def latency_floor_s(nodes: int, rtt_s: float, collectives: float = 1.0) -> float:
    """``2(N-1) · RTT/2`` per ring all-reduce: each of its steps waits one one-way delay."""
    return 0.0 if nodes <= 1 else collectives * (nodes - 1) * rtt_s


def collectives_per_step(hook: Hook, full_bytes: float, settings: HookSettings) -> float:
    """All-reduces per optimizer step, amortized: one per DDP bucket, PowerSGD two per bucket,
    the periodic methods one per bucket every period."""
    buckets = max(1, math.ceil(full_bytes / settings.bucket_bytes))
    if hook is Hook.POWERSGD:
        return 2.0 * buckets
    if hook is Hook.LOCALSGD:
        return buckets / settings.localsgd_period
    if hook in (Hook.DILOCO, Hook.DILOCO_OVERLAP):
        return buckets / settings.diloco_inner_steps
    return float(buckets)


def powersgd_elements(shape: Sequence[int], rank: int) -> int:
    """Values torch's PowerSGD sends for one gradient tensor (see module docstring)."""
    total = math.prod(shape)
    if len(shape) <= 1:
        return total
    n, m = shape[0], total // shape[0]
    r = min(rank, n, m)
    if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
        return (n + m) * r
    return total


def hook_bytes(hook: Hook, shapes: Iterable[Sequence[int]], settings: HookSettings) -> float:
    shapes = [tuple(s) for s in shapes]
    full = GRAD_BYTES * sum(math.prod(s) for s in shapes)
    if hook is Hook.NONE:
        return float(full)
    if hook in (Hook.FP16, Hook.BF16):
        return full / 2
    if hook is Hook.POWERSGD:
        return float(GRAD_BYTES * sum(powersgd_elements(s, settings.powersgd_rank) for s in shapes))
    if hook in (Hook.DILOCO, Hook.DILOCO_OVERLAP):
        return full / settings.diloco_inner_steps
    return full / settings.localsgd_period


def hook_floor(hook: Hook, shapes: Sequence[Sequence[int]], settings: HookSettings, nodes: int,
               bandwidth_bytes_s: float, rtt_s: float) -> HookFloor:
    nbytes = hook_bytes(hook, shapes, settings)
    full = GRAD_BYTES * sum(math.prod(s) for s in shapes)
    latency = latency_floor_s(nodes, rtt_s, collectives_per_step(hook, full, settings))
    return HookFloor(hook, nbytes, ring_floor_s(nbytes, nodes, bandwidth_bytes_s) + latency, latency)


def plan(bandwidth_bytes_s: float, nodes: int, shapes: Iterable[Sequence[int]],
         settings: HookSettings = HookSettings(), budget_s: float = DEFAULT_BUDGET_S,
         rtt_s: float = 0.0) -> CommPlan:
    shapes = [tuple(s) for s in shapes]
    floors = tuple(hook_floor(h, shapes, settings, nodes, bandwidth_bytes_s, rtt_s) for h in Hook)
    by_hook = {f.hook: f for f in floors}
    fits = [h for h in PREFERENCE if by_hook[h].floor_s <= budget_s]
    mbit = bandwidth_bytes_s * 8 / 1e6
    if fits:
        chosen = fits[0]
        skipped = [h for h in PREFERENCE[:PREFERENCE.index(chosen)]]
        why = "".join(f"{h.value} {_ms(by_hook[h].floor_s)} > budget; " for h in skipped)
        reason = (f"{why}{chosen.value} {_ms(by_hook[chosen].floor_s)} <= budget "
                  f"{_ms(budget_s)} per step")
    else:
        chosen = min(PREFERENCE, key=lambda h: by_hook[h].floor_s)
        reason = (f"no hook fits the budget {_ms(budget_s)} per step; {chosen.value} has the "
                  f"lowest floor, {_ms(by_hook[chosen].floor_s)}")
    gradient = GRAD_BYTES * sum(math.prod(s) for s in shapes)
    reason = (f"{gradient / 1e6:.2f} MB of gradients, {nodes} nodes, {mbit:.1f} Mbit/s per node, "
              f"RTT {_ms(rtt_s)}: " + reason)
    return CommPlan(nodes, bandwidth_bytes_s, rtt_s, gradient, budget_s, floors, chosen, reason)


def node_bandwidth(links: Iterable[tuple[str, float | None]]) -> float | None:
    """Bytes/s per node from measured links ``(source host, Mbit/s)``: each host's best link
    (links measured at the same time share a host's port), then the slowest host (a ring
    all-reduce moves at the pace of its slowest member). None when nothing was measured."""
    best: dict[str, float] = {}
    for source, mbit in links:
        if mbit is not None and mbit > 0:
            best[source] = max(best.get(source, 0.0), mbit)
    if not best:
        return None
    return min(best.values()) * 1e6 / 8


def link_rtt(rtts_ms: Iterable[float | None]) -> float:
    """Seconds of round trip for the plan: the slowest measured link (a ring waits for it)."""
    measured = [r for r in rtts_ms if r is not None and r >= 0]
    return max(measured) / 1e3 if measured else 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
