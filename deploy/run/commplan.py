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
  With ``comm.diloco_wire_dtype=bf16`` the pseudo-gradient crosses in 2 bytes a parameter: S/2H.

- ``hier`` (with two sites or more, docs/sites.md): inside each site DDP's all-reduce of S every
  step over the largest site's hosts at the slowest site's measured bandwidth and RTT (one
  latency term per bucket), plus, per round, one in-site all-reduce and one broadcast of S; between
  sites one all-reduce of S across the K site representatives every H steps at the slowest
  measured link between sites (one latency term per round; S/2 with the bf16 wire). ``floor_s`` is their sum per step
  (``inside_s`` + ``between_s``); the overlap can hide ``between_s`` behind the next round.

With sites the flat hooks' ring crosses the links between sites, so their floors use the slower
of the two measured bandwidths and RTTs. The recommendation is the most exact hook whose floor
fits the budget per step (default ``DEFAULT_BUDGET_S``), in the order none, fp16, powersgd,
hier (exact inside each site; only with sites, and some site of two hosts or more), localsgd,
diloco; when none fits, the hook with the lowest floor. With the trainer's ``sync_bn: true``
diloco is no candidate (the trainer refuses it and diloco-overlap with SyncBatchNorm) and the
reason says so. Nothing here touches the network.

``largest_collective``, what the trainer's ``dist.timeout`` must outlast: DDP's initial broadcast of S
from rank 0 (S / B), a full-gradient step (none; powersgd's and localsgd's warm-up) or the DiLoCo
family's outer all-reduce at its wire dtype, each at the slowest measured link, ring latency included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Iterable, Mapping, Sequence

DEFAULT_BUDGET_S = 0.05  # communication per step we accept without compressing further
DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
GRAD_BYTES = 4  # fp32 gradients: DDP reduces in the parameters' dtype
MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default
# A host's link probe reports any finite number: `mbit_s: 5e-324` would make every floor infinite
# (and commplan.json unreadable), `1e308` the bandwidth. Measurements are held to a range no real link leaves.
MIN_MBIT_S, MAX_MBIT_S = 1e-3, 1e7  # 1 kbit/s .. 10 Tbit/s
MAX_RTT_MS = 600_000.0  # 10 minutes


class Hook(str, Enum):
    """The trainer's ``comm.hook`` values (train/config.py ``CommHook``)."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    LOCALSGD = "localsgd"
    DILOCO = "diloco"
    DILOCO_OVERLAP = "diloco-overlap"
    HIER = "hier"


PREFERENCE = (Hook.NONE, Hook.FP16, Hook.POWERSGD, Hook.LOCALSGD, Hook.DILOCO)  # most exact first
SITE_PREFERENCE = (Hook.NONE, Hook.FP16, Hook.POWERSGD, Hook.HIER, Hook.LOCALSGD, Hook.DILOCO)
# Flat DiLoCo's inner steps communicate nothing; SyncBatchNorm would at each of them, so the
# trainer refuses `sync_bn: true` with these (train/config_rules.check_combinations). hier keeps it.
NO_SYNC_BN = (Hook.DILOCO, Hook.DILOCO_OVERLAP)


@dataclass(frozen=True)
class HookSettings:
    powersgd_rank: int = 4
    localsgd_period: int = 4
    diloco_inner_steps: int = 8
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    diloco_wire_bytes: int = GRAD_BYTES  # per parameter on DiLoCo's outer all-reduce (bf16: 2)
    sync_bn: bool = False  # the trainer's SyncBatchNorm: the NO_SYNC_BN hooks are no candidates


@dataclass(frozen=True)
class HookFloor:
    hook: Hook
    bytes_per_step: float  # S_hook: what each rank contributes to the all-reduce per step
    floor_s: float  # ring all-reduce floor per step at the measured bandwidth and RTT
    latency_s: float = 0.0  # the part of floor_s that is latency (RTT-bound ring steps)
    inside_s: float | None = None  # hier: the part inside the sites
    between_s: float | None = None  # hier: the part between sites (overlapped with the next round)


@dataclass(frozen=True)
class LinkStats:
    bandwidth_bytes_s: float  # per node, as node_bandwidth
    rtt_s: float  # the slowest link's round trip


@dataclass(frozen=True)
class SiteLinks:
    """The measured links, split into those inside a site and those between sites."""

    sites: tuple[tuple[str, tuple[str, ...]], ...]  # (site, its hosts), in host order
    inside: LinkStats | None  # None: no site has two measured hosts
    between: LinkStats | None  # None: one site, or no link between sites measured

    @property
    def largest(self) -> int:
        return max(len(hosts) for _, hosts in self.sites)

    @property
    def places(self) -> bool:
        """Sites worth a hierarchy: two or more, one with two hosts or more, measured between."""
        return len(self.sites) > 1 and self.largest > 1 and self.between is not None


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
    site_links: SiteLinks | None = None  # with sites declared: what the floors inside and between used
    links: tuple[tuple[str, str, float | None, float | None], ...] = ()  # (source, target, Mbit/s, RTT ms)
    hint: str = ""  # what a setting would save on the hook the run uses (``wire_hint``)
    places_hint: str = ""  # measured places the inventory does not declare, and hier on them (``places_hint``)
    timeout: TimeoutAdvice | None = None  # dist.timeout against the hook's largest collective

    def floor_of(self, hook: Hook) -> HookFloor | None:
        return next((f for f in self.floors if f.hook is hook), None)


@dataclass(frozen=True)
class Collective:
    what: str
    nbytes: float  # what each rank contributes (the broadcast: what rank 0 sends)
    bandwidth_bytes_s: float  # the slowest link it crosses
    seconds: float  # its floor at that bandwidth, ring latency included


@dataclass(frozen=True)
class TimeoutAdvice:
    collective: Collective
    timeout_s: float  # the run's dist.timeout as it stood
    user_set: bool  # the user's own (--timeout or a dist.timeout= override): never raised
    needed_s: int  # a safety factor × the collective, rounded up (deploy/edges/comm.timeout_advice)
    raised_to: int | None  # the dist.timeout= the controller adds; None: it suffices, or it is the user's


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
        return full * settings.diloco_wire_bytes / GRAD_BYTES / settings.diloco_inner_steps
    return full / settings.localsgd_period


def hook_floor(hook: Hook, shapes: Sequence[Sequence[int]], settings: HookSettings, nodes: int,
               bandwidth_bytes_s: float, rtt_s: float) -> HookFloor:
    nbytes = hook_bytes(hook, shapes, settings)
    full = GRAD_BYTES * sum(math.prod(s) for s in shapes)
    latency = latency_floor_s(nodes, rtt_s, collectives_per_step(hook, full, settings))
    return HookFloor(hook, nbytes, ring_floor_s(nbytes, nodes, bandwidth_bytes_s) + latency, latency)


def hier_floor(shapes: Sequence[Sequence[int]], settings: HookSettings, sites: SiteLinks) -> HookFloor:
    """``hier`` per optimizer step (module docstring): inside the sites, then between them."""
    full = float(GRAD_BYTES * sum(math.prod(s) for s in shapes))
    h, n, k = settings.diloco_inner_steps, sites.largest, len(sites.sites)
    inside = latency_in = 0.0
    if sites.inside is not None:
        step = ring_floor_s(full, n, sites.inside.bandwidth_bytes_s)
        latency_in = latency_floor_s(n, sites.inside.rtt_s, collectives_per_step(Hook.NONE, full, settings))
        per_round = 2 * ring_floor_s(full, n, sites.inside.bandwidth_bytes_s) + latency_floor_s(n, sites.inside.rtt_s, 2)
        inside = step + latency_in + per_round / h
        latency_in += latency_floor_s(n, sites.inside.rtt_s, 2) / h
    latency_x = between = 0.0
    wire = full * settings.diloco_wire_bytes / GRAD_BYTES  # the pseudo-gradient between sites
    if sites.between is not None:
        latency_x = latency_floor_s(k, sites.between.rtt_s) / h
        between = ring_floor_s(wire, k, sites.between.bandwidth_bytes_s) / h + latency_x
    return HookFloor(Hook.HIER, wire / h, inside + between, latency_in + latency_x, inside, between)


def plan(bandwidth_bytes_s: float, nodes: int, shapes: Iterable[Sequence[int]],
         settings: HookSettings = HookSettings(), budget_s: float = DEFAULT_BUDGET_S,
         rtt_s: float = 0.0, sites: SiteLinks | None = None) -> CommPlan:
    shapes = [tuple(s) for s in shapes]
    if sites is not None and sites.between is not None:  # the flat ring crosses the links between sites
        bandwidth_bytes_s = min(bandwidth_bytes_s, sites.between.bandwidth_bytes_s)
        rtt_s = max(rtt_s, sites.between.rtt_s)
    flat = [h for h in Hook if h is not Hook.HIER]
    floors = tuple(hook_floor(h, shapes, settings, nodes, bandwidth_bytes_s, rtt_s) for h in flat)
    preference = SITE_PREFERENCE if sites is not None and sites.places else PREFERENCE
    if settings.sync_bn:
        preference = tuple(h for h in preference if h not in NO_SYNC_BN)
    if sites is not None:  # `--comm hier` may run on any sites (a host without one is its own)
        floors += (hier_floor(shapes, settings, sites),)
    by_hook = {f.hook: f for f in floors}
    fits = [h for h in preference if by_hook[h].floor_s <= budget_s]
    mbit = bandwidth_bytes_s * 8 / 1e6
    if fits:
        chosen = fits[0]
        skipped = [h for h in preference[:preference.index(chosen)]]
        why = "".join(f"{_floor(by_hook[h])} > budget; " for h in skipped)
        reason = f"{why}{_floor(by_hook[chosen])} <= budget {_ms(budget_s)} per step"
    else:
        chosen = min(preference, key=lambda h: by_hook[h].floor_s)
        other = "other " if settings.sync_bn else ""  # than those the reason's start leaves out
        reason = (f"no {other}hook fits the budget {_ms(budget_s)} per step; {chosen.value} has the "
                  f"lowest floor, {_ms(by_hook[chosen].floor_s)}")
    gradient = GRAD_BYTES * sum(math.prod(s) for s in shapes)
    where = f" ({_sites_text(sites)})" if sites is not None and sites.places else ""
    reason = (f"{gradient / 1e6:.2f} MB of gradients, {nodes} nodes{where}, {mbit:.1f} Mbit/s per node, "
              f"RTT {_ms(rtt_s)}: " + _sync_bn_text(settings, by_hook) + reason)
    return CommPlan(nodes, bandwidth_bytes_s, rtt_s, gradient, budget_s, floors, chosen, reason, sites)


OUTER_HOOKS = (Hook.DILOCO, Hook.DILOCO_OVERLAP, Hook.HIER)  # a pseudo-gradient that can cross in bf16
WARM_UP = {Hook.NONE: "a full-gradient all-reduce step", Hook.POWERSGD: "a powersgd warm-up step (full all-reduce)",
           Hook.LOCALSGD: "a localsgd warm-up step (full all-reduce)"}


def largest_collective(plan: CommPlan, hook: Hook, settings: HookSettings) -> Collective:
    """The hook's longest single collective (module docstring); the first of equals."""
    full, b, n, rtt = float(plan.gradient_bytes), plan.bandwidth_bytes_s, plan.nodes, plan.rtt_s
    buckets = collectives_per_step(Hook.NONE, full, settings)
    wire = full * settings.diloco_wire_bytes / GRAD_BYTES
    found = [Collective("DDP's initial broadcast of the parameters", full, b, full / b)]  # every hook builds DDP
    if hook in WARM_UP:
        found.append(Collective(WARM_UP[hook], full, b, ring_floor_s(full, n, b) + latency_floor_s(n, rtt, buckets)))
    sites = plan.site_links if hook is Hook.HIER else None
    if sites is not None and (link := sites.inside) is not None:
        m = sites.largest
        inside = ring_floor_s(full, m, link.bandwidth_bytes_s) + latency_floor_s(m, link.rtt_s, buckets)
        found.append(Collective("a full-gradient all-reduce step inside a site", full, link.bandwidth_bytes_s, inside))
    if sites is not None and sites.between is not None:
        k, link = len(sites.sites), sites.between
        found.append(Collective("hier's outer all-reduce between sites", wire, link.bandwidth_bytes_s,
                                ring_floor_s(wire, k, link.bandwidth_bytes_s) + latency_floor_s(k, link.rtt_s)))
    elif hook in OUTER_HOOKS:  # hier without sites runs as flat diloco-overlap
        outer = ring_floor_s(wire, n, b) + latency_floor_s(n, rtt, buckets)
        found.append(Collective(f"{hook.value}'s outer all-reduce", wire, b, outer))
    return max(found, key=lambda c: c.seconds)


def wire_hint(hook: Hook, plan: CommPlan, shapes: Sequence[Sequence[int]], settings: HookSettings) -> str:
    """For a DiLoCo-family hook whose floor exceeds the budget with an fp32 pseudo-gradient: its
    floor with ``comm.diloco_wire_dtype=bf16`` (half the bytes on the outer all-reduce); else ""."""
    now = plan.floor_of(hook)
    narrowable = hook in OUTER_HOOKS and settings.diloco_wire_bytes == GRAD_BYTES
    if not narrowable or now is None or now.floor_s <= plan.budget_s:
        return ""
    half = replace(settings, diloco_wire_bytes=GRAD_BYTES // 2)
    if hook is Hook.HIER:
        assert plan.site_links is not None  # a hier floor is only planned with sites
        bf16 = hier_floor(shapes, half, plan.site_links)
    else:
        bf16 = hook_floor(hook, shapes, half, plan.nodes, plan.bandwidth_bytes_s, plan.rtt_s)
    where = " between sites" if hook is Hook.HIER else ""
    return (f"comm.diloco_wire_dtype=bf16 would send {hook.value}'s pseudo-gradient{where} in half the bytes: "
            f"floor {_ms(bf16.floor_s)} per step instead of {_ms(now.floor_s)} (rounded to bfloat16, docs/sites.md)")


def places_hint(hook: Hook, now: CommPlan, shapes: Sequence[Sequence[int]], settings: HookSettings,
                places: Sequence[Sequence[str]], finding: str) -> str:
    """When the measured links fall into `places` that the inventory does not declare (`finding`,
    check-network's WARN with the `site:` lines) and, with them declared, `auto` would choose
    hier: what that would change; else "". Without sites hier is flat DiLoCo-overlap, so even a
    run of `--comm hier` gets the hint."""
    site_of = {h: f"site-{i}" for i, place in enumerate(places, 1) for h in place}
    with_places = plan(now.bandwidth_bytes_s, now.nodes, shapes, settings, now.budget_s, now.rtt_s,
                       site_links(now.links, site_of))
    better = with_places.floor_of(Hook.HIER)
    current = now.floor_of(hook)
    if with_places.recommended is not Hook.HIER or better is None:
        return ""
    this = f"this run's {_floor(current)}" if current is not None else f"this run's {hook.value}"
    return f"{finding}; with them declared, --comm auto would choose {_floor(better)} per step ({this})"


def _sync_bn_text(settings: HookSettings, by_hook: Mapping[Hook, HookFloor]) -> str:
    """Why the hooks the trainer refuses with SyncBatchNorm are no candidates, with their floors
    (what sync_bn=false would make possible); "" without it."""
    if not settings.sync_bn:
        return ""
    return (f"sync_bn true leaves out {' and '.join(_floor(by_hook[h]) for h in NO_SYNC_BN)} (SyncBatchNorm "
            "would communicate at every inner step); ")


def _floor(floor: HookFloor) -> str:
    if floor.inside_s is None or floor.between_s is None:
        return f"{floor.hook.value} {_ms(floor.floor_s)}"
    return f"{floor.hook.value} {_ms(floor.floor_s)} ({_ms(floor.inside_s)} inside + {_ms(floor.between_s)} between)"


def _sites_text(sites: SiteLinks) -> str:
    between = sites.between
    assert between is not None
    text = f"{len(sites.sites)} sites of {'+'.join(str(len(h)) for _, h in sites.sites)}, between them " \
           f"{between.bandwidth_bytes_s * 8 / 1e6:.1f} Mbit/s, RTT {_ms(between.rtt_s)}"
    if sites.inside is not None:
        text += f"; inside {sites.inside.bandwidth_bytes_s * 8 / 1e6:.1f} Mbit/s, RTT {_ms(sites.inside.rtt_s)}"
    return text


def site_links(links: Iterable[tuple[str, str, float | None, float | None]],
               site_of: Mapping[str, str]) -> SiteLinks | None:
    """Measured links ``(source, target, Mbit/s, RTT ms)`` split by ``site_of`` (every host of the
    run, in host order). None without hosts."""
    links = list(links)
    sites: dict[str, list[str]] = {}
    for host, site in site_of.items():
        sites.setdefault(site, []).append(host)
    if not sites:
        return None
    inner = [(a, m, r) for a, b, m, r in links if site_of.get(a) == site_of.get(b) is not None]
    cross = [(a, m, r) for a, b, m, r in links if a in site_of and b in site_of and site_of[a] != site_of[b]]
    between_b = node_bandwidth((a, m) for a, m, _ in cross)
    between = None if between_b is None else LinkStats(between_b, link_rtt(r for _, _, r in cross))
    inside_b = node_bandwidth((a, m) for a, m, _ in inner)
    inside = None if inside_b is None else LinkStats(inside_b, link_rtt(r for _, _, r in inner))
    return SiteLinks(tuple((s, tuple(h)) for s, h in sites.items()), inside, between)


def node_bandwidth(links: Iterable[tuple[str, float | None]]) -> float | None:
    """Bytes/s per node from measured links ``(source host, Mbit/s)``: each host's best link
    (links measured at the same time share a host's port), then the slowest host (a ring
    all-reduce moves at the pace of its slowest member), each link held to MIN_MBIT_S..MAX_MBIT_S.
    None when nothing was measured."""
    best: dict[str, float] = {}
    for source, mbit in links:
        if mbit is not None and mbit > 0:
            best[source] = max(best.get(source, 0.0), min(max(mbit, MIN_MBIT_S), MAX_MBIT_S))
    if not best:
        return None
    return min(best.values()) * 1e6 / 8


def link_rtt(rtts_ms: Iterable[float | None]) -> float:
    """Seconds of round trip for the plan: the slowest measured link (a ring waits for it), at most MAX_RTT_MS."""
    measured = [min(r, MAX_RTT_MS) for r in rtts_ms if r is not None and r >= 0]
    return max(measured) / 1e3 if measured else 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
