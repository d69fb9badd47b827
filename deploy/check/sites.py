"""Sites the measured links suggest (`fab check-network --bandwidth`, docs/sites.md). Pure.

Each unordered pair of hosts gets its best measured bandwidth (either direction) and its
smallest handshake RTT. Every gap of at least ``BANDWIDTH_GAP`` (5x) between consecutive
bandwidths, and of at least ``RTT_GAP`` (10x) between consecutive RTTs, is a candidate cut: the
hosts joined by single linkage through every link at least as close as the gap's upper side. A
cut counts only when every measured link between two of its places is that much slower (in
bandwidth, or in RTT) than every measured link inside one. Of those, a cut the RTT separates
(``RTT_GAP``) wins over one only the bandwidth does, then the one that separates best in both
measures at once (the product of its two separations). The RTT first, because places nest: an
office LAN at 1 Gbit/s beside a rented pair at 25 Gbit/s in a datacenter is a wider bandwidth gap
than the 100 Mbit/s between them, but the RTT (0.3 ms against 30) says where the places end. RTTs
under ``LAN_RTT_MS`` count as equal: on a LAN the handshake's time is the hosts' scheduling and
queues, not distance (a loaded Wi-Fi pair at 0.7 ms against a datacenter pair at 0.05 ms once
read as 14x in a CI run, and the product then split the Wi-Fi pair). When the places differ from the inventory's sites (a host without `site:` is a
place of its own), a WARN gives the `site:` lines that would declare them. With sites declared,
``place_links`` sums the matrix up by site: inside each, and between each two.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations_with_replacement
from typing import Iterable, Mapping, Sequence

from meshrun.deploy.check.findings import Finding, warn

BANDWIDTH_GAP = 5.0  # x: a link this much slower than the LAN is between places
RTT_GAP = 10.0
LAN_RTT_MS = 1.0  # handshakes faster than this are one LAN's: their differences are not distance

Pair = frozenset[str]
Link = tuple[str, str, "float | None", "float | None"]  # (source, target, Mbit/s, RTT ms)


def pair_stats(links: Iterable[Link]) -> dict[Pair, tuple[float | None, float | None]]:
    """Per unordered pair: (best Mbit/s, smallest RTT ms) of its measured directions."""
    out: dict[Pair, tuple[float | None, float | None]] = {}
    for source, target, mbit, rtt in links:
        if source == target:
            continue
        key = frozenset((source, target))
        best, fastest = out.get(key, (None, None))
        if mbit is not None and mbit > 0:
            best = mbit if best is None else max(best, mbit)
        if rtt is not None and rtt >= 0:
            fastest = rtt if fastest is None else min(fastest, rtt)
        out[key] = (best, fastest)
    return out


def clusters(hosts: Sequence[str], links: Iterable[Link]) -> tuple[tuple[str, ...], ...] | None:
    """The places the links show, in host order, or None when they show one place."""
    stats = {p: v for p, v in pair_stats(links).items() if p <= set(hosts)}
    bandwidth = {p: b for p, (b, _) in stats.items() if b is not None}
    nearness = {p: 1.0 / max(r, LAN_RTT_MS) for p, (_, r) in stats.items() if r is not None}
    best: tuple[tuple[bool, float], tuple[tuple[str, ...], ...]] | None = None
    for parts in _candidates(hosts, bandwidth, BANDWIDTH_GAP) + _candidates(hosts, nearness, RTT_GAP):
        by_bandwidth, by_rtt = _separation(parts, bandwidth), _separation(parts, nearness)
        if by_bandwidth < BANDWIDTH_GAP and by_rtt < RTT_GAP:
            continue
        score = (by_rtt >= RTT_GAP, by_bandwidth * by_rtt)
        if best is None or score > best[0]:
            best = (score, parts)
    return None if best is None else best[1]


def _candidates(hosts: Sequence[str], closeness: Mapping[Pair, float],
                gap: float) -> list[tuple[tuple[str, ...], ...]]:
    """The places of each cut at a gap of at least `gap` between consecutive closeness values."""
    values = sorted(set(closeness.values()), reverse=True)
    out = []
    for upper, lower in zip(values, values[1:]):
        if upper >= gap * lower:
            parts = _components(hosts, [p for p, v in closeness.items() if v >= upper])
            if len(parts) >= 2:
                out.append(parts)
    return out


def _separation(parts: Sequence[Sequence[str]], closeness: Mapping[Pair, float]) -> float:
    """How many times closer the farthest pair inside a place is than the closest pair between
    two places (1 where a side has no measured pair: that measure tells nothing)."""
    place = {h: i for i, part in enumerate(parts) for h in part}
    inside = [v for p, v in closeness.items() if len({place[h] for h in p}) == 1]
    between = [v for p, v in closeness.items() if len({place[h] for h in p}) == 2]
    return min(inside) / max(between) if inside and between else 1.0


def _components(hosts: Sequence[str], edges: Iterable[Pair]) -> tuple[tuple[str, ...], ...]:
    root = {h: h for h in hosts}

    def find(h: str) -> str:
        while root[h] != h:
            h = root[h]
        return h

    for edge in edges:
        a, b = sorted(edge)
        root[find(b)] = find(a)
    parts: dict[str, list[str]] = {}
    for h in hosts:
        parts.setdefault(find(h), []).append(h)
    return tuple(tuple(part) for part in parts.values())


def place_of(host: str, sites: Mapping[str, str | None]) -> str:
    """The host's declared site, else ``host:NAME``: a place of its own (as the trainer keys it)."""
    return sites.get(host) or f"host:{host}"


def declared(hosts: Sequence[str], sites: Mapping[str, str | None]) -> tuple[tuple[str, ...], ...]:
    """The inventory's places, in host order: a host without `site:` is one of its own."""
    places: dict[str, list[str]] = {}
    for h in hosts:
        places.setdefault(place_of(h, sites), []).append(h)
    return tuple(tuple(p) for p in places.values())


def site_lines(found: Sequence[Sequence[str]], sites: Mapping[str, str | None]) -> tuple[str, ...]:
    """One `host: {site: NAME}` line per host: a place keeps the site most of its hosts declare
    (when no other place took it), else `site-N`."""
    used: set[str] = set()
    lines = []
    for n, place in enumerate(found, 1):
        names = [sites[h] for h in place if sites.get(h)]
        name = max(sorted(set(names)), key=names.count) if names else None
        if name is None or name in used:
            name = f"site-{n}"
        used.add(name)
        lines += [f"{h}: {{site: {name}}}" for h in place]
    return tuple(lines)


def undeclared_places(hosts: Sequence[str], sites: Mapping[str, str | None],
                      links: Iterable[Link]) -> tuple[tuple[tuple[str, ...], ...], str] | None:
    """The places the links show and the WARN's text, when they are not the inventory's sites."""
    found = clusters(hosts, links)
    if found is None or set(found) == set(declared(hosts, sites)):
        return None
    shown = " | ".join(", ".join(place) for place in found)
    return found, (f"the measured links fall into {len(found)} places ({shown}; >= {BANDWIDTH_GAP:g}x bandwidth or "
                   f">= {RTT_GAP:g}x RTT between them) that the inventory's sites do not declare; write: "
                   f"{'; '.join(site_lines(found, sites))} (docs/sites.md)")


def site_findings(hosts: Sequence[str], sites: Mapping[str, str | None], links: Iterable[Link]) -> list[Finding]:
    """A WARN when the measured places are not the inventory's sites; nothing otherwise."""
    undeclared = undeclared_places(hosts, sites, links)
    return [] if undeclared is None else [warn("cluster", undeclared[1])]


@dataclass(frozen=True)
class PlaceLinks:
    """The measured pairs inside one declared site (``a == b``) or between two sites: the slowest
    pair's bandwidth and the farthest pair's RTT (each pair by its best measured direction, as
    ``pair_stats``), which is what a ring over those hosts waits for."""

    a: str
    b: str
    pairs: int  # pairs with a measurement
    mbit_s: float | None  # None: no bandwidth measured (check-network without --bandwidth)
    rtt_ms: float | None


def place_links(hosts: Sequence[str], sites: Mapping[str, str | None], links: Iterable[Link]) -> tuple[PlaceLinks, ...]:
    """Per site and per two sites, in host order (a host without ``site:`` is ``host:NAME``), for
    the pairs measured; () when the inventory declares no site among `hosts`."""
    if not any(sites.get(h) for h in hosts):
        return ()
    key = {h: place_of(h, sites) for h in hosts}
    names = list(dict.fromkeys(key[h] for h in hosts))
    measured: dict[tuple[str, str], list[tuple[float | None, float | None]]] = {}
    for pair, stats in pair_stats(links).items():
        if pair <= key.keys() and stats != (None, None):
            a, b = sorted((key[h] for h in pair), key=names.index)
            measured.setdefault((a, b), []).append(stats)
    out = []
    for a, b in combinations_with_replacement(names, 2):
        found = measured.get((a, b), [])
        mbits = [m for m, _ in found if m is not None]
        rtts = [r for _, r in found if r is not None]
        if found:
            out.append(PlaceLinks(a, b, len(found), min(mbits) if mbits else None, max(rtts) if rtts else None))
    return tuple(out)
