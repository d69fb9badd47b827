"""Gradient communication plan, pure: bandwidth + nodes + gradient shapes → floors → a hook.

The ring all-reduce floor per optimizer step is ``2(N-1)/N · S_hook / B`` (N nodes, B bytes/s
per node, S_hook the bytes the hook puts on the wire per step; docs/performance.md). S_hook is
estimated from the parameter shapes the trainer prints (``python -m train --describe``):

- ``none``: S, the fp32 gradients (4 bytes per parameter);
- ``fp16`` / ``bf16``: S/2;
- ``powersgd``: torch's ``powerSGD_hook`` sends, per matrix of shape (n, m) (trailing dimensions
  flattened), P (n·r) and Q (m·r) with r = min(rank, n, m), but only when
  ``(n+m)·r·2 < n·m`` (torch's ``min_compression_rate`` 2); other tensors go uncompressed;
- ``localsgd``: S every ``period`` steps, so S/period amortized (after the warm-up).

The recommendation is the most exact hook whose floor fits the budget per step (default
``DEFAULT_BUDGET_S``), in the order none, fp16, powersgd, localsgd; when none fits, the hook with
the lowest floor. Nothing here touches the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

DEFAULT_BUDGET_S = 0.05  # communication per step we accept without compressing further
GRAD_BYTES = 4  # fp32 gradients: DDP reduces in the parameters' dtype
MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


class Hook(str, Enum):
    """The trainer's ``comm.hook`` values (train/config.py ``CommHook``)."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    LOCALSGD = "localsgd"


PREFERENCE = (Hook.NONE, Hook.FP16, Hook.POWERSGD, Hook.LOCALSGD)  # most exact first


@dataclass(frozen=True)
class HookSettings:
    powersgd_rank: int = 4
    localsgd_period: int = 4


@dataclass(frozen=True)
class HookFloor:
    hook: Hook
    bytes_per_step: float  # S_hook: what each rank contributes to the all-reduce per step
    floor_s: float  # ring all-reduce floor per step at the measured bandwidth


@dataclass(frozen=True)
class CommPlan:
    nodes: int
    bandwidth_bytes_s: float
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
    return full / settings.localsgd_period


def plan(bandwidth_bytes_s: float, nodes: int, shapes: Iterable[Sequence[int]],
         settings: HookSettings = HookSettings(), budget_s: float = DEFAULT_BUDGET_S) -> CommPlan:
    shapes = [tuple(s) for s in shapes]
    floors = tuple(HookFloor(h, b, ring_floor_s(b, nodes, bandwidth_bytes_s))
                   for h in Hook for b in [hook_bytes(h, shapes, settings)])
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
    reason = (f"{gradient / 1e6:.2f} MB of gradients, {nodes} nodes, {mbit:.1f} Mbit/s per node: "
              + reason)
    return CommPlan(nodes, bandwidth_bytes_s, gradient, budget_s, floors, chosen, reason)


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


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
