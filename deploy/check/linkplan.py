"""Which host-to-host links `fab check-network` probes, chosen by the number of hosts. Pure.

Up to ``ALL_PAIRS_MAX_HOSTS`` hosts every ordered pair is probed, all at once (992 connects at
32 simulated hosts, measured in about a second). Past it the pairs grow as N², so each host probes
the hosts 1, 2, 4, … places after it in inventory order (wrapping round): ⌈log₂ N⌉ peers each, so
every host probes and is probed by as many hosts, any two hosts are joined by a chain of probed
links, and a host whose inbound or outbound path is broken still shows up. 100 hosts: 700 links
instead of 9,900; 1,000 hosts: 10,000 instead of 999,000. The rule is stated in the output.

Each host takes its peers in order of offset (the next host, then the one after, …), and
`--bandwidth` measures its peers one after another for the same time: so at each step every host
sends to one host and receives from one, and no two transfers share a receiver. In host order
(h1 → h2, h2 → h1 and h3 → h1 at once) two of three hosts measured half their link, and two hosts
of one site sending to the other site at once measured half the link between sites.

With sites declared (inventory `site:`, docs/sites.md), the sample past the limit follows them, as
`--comm hier`'s plan needs the links inside each site and between sites (deploy/run/commplan.py):
each host first probes every host of its own site (in order of offset, as above: one receiver per
host at each step inside a site), then, in each other site, the host at its own index there, if
that site has one. So no two hosts of a site send to one receiver of another (30 office hosts
all probing the 5 at home would measure a sixth of the link each): a site's first hosts carry its
links between sites, and sites of equal size stay one receiver per host at each step. Past the
limit in sites, or inside a site, the same 1, 2, 4, … offsets apply to sites and to a site's
hosts. A host without a site is a place of its own, so without any site (or with one) this is
the plan above. 1000 hosts in 10 sites of 100: 16 links a host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ALL_PAIRS_MAX_HOSTS = 32


@dataclass(frozen=True)
class LinkPlan:
    peers: Mapping[str, tuple[str, ...]]  # source host -> the hosts it probes, in probe order
    rule: str  # for the console and --json: how the pairs were chosen

    @property
    def pairs(self) -> int:
        return sum(len(targets) for targets in self.peers.values())


def offsets(n: int) -> tuple[int, ...]:
    """1, 2, 4, … below n."""
    found, step = [], 1
    while step < n:
        found.append(step)
        step *= 2
    return tuple(found)


def steps_for(n: int) -> tuple[int, ...]:
    """The offsets a host takes among n: every other one up to the limit, else 1, 2, 4, …"""
    return tuple(range(1, n)) if n <= ALL_PAIRS_MAX_HOSTS else offsets(n)


def link_plan(names: Sequence[str], site_of: Mapping[str, str | None] | None = None) -> LinkPlan:
    n = len(names)
    if n <= ALL_PAIRS_MAX_HOSTS:
        return LinkPlan({names[i]: tuple(names[(i + d) % n] for d in steps_for(n)) for i in range(n)}, "every pair")
    places = _places(names, site_of or {})
    if 1 < len(places) < n:  # some site of two hosts or more, and more than one place
        return _by_site(names, places)
    steps = offsets(n)
    peers = {names[i]: tuple(names[(i + d) % n] for d in steps) for i in range(n)}
    return LinkPlan(peers, f"sampled, of {n * (n - 1)} pairs: each host to the hosts "
                           f"{', '.join(map(str, steps[:3]))}, … {steps[-1]} places after it in inventory order; "
                           f"every pair up to {ALL_PAIRS_MAX_HOSTS} hosts")


def _places(names: Sequence[str], site_of: Mapping[str, str | None]) -> list[tuple[str, ...]]:
    """The hosts of each site in inventory order, sites in order of first appearance; a host
    without a site is a place of its own."""
    groups: dict[object, list[str]] = {}
    for name in names:
        site = site_of.get(name)
        groups.setdefault(("site", site) if site is not None else ("host", name), []).append(name)
    return [tuple(members) for members in groups.values()]


def _by_site(names: Sequence[str], places: list[tuple[str, ...]]) -> LinkPlan:
    k, peers = len(places), {}
    for s, members in enumerate(places):
        for i, host in enumerate(members):
            inside = tuple(members[(i + d) % len(members)] for d in steps_for(len(members)))
            between = tuple(places[(s + t) % k][i] for t in steps_for(k) if i < len(places[(s + t) % k]))
            peers[host] = inside + between
    n = len(names)
    return LinkPlan({name: peers[name] for name in names},
                    f"sampled by site, of {n * (n - 1)} pairs ({k} sites): each host to every host of its own "
                    f"site, then to the host at its index in each other site; past {ALL_PAIRS_MAX_HOSTS} sites or "
                    f"hosts in a site, to those 1, 2, 4, … places after it")


LINK_CONNECT_S = 3.0  # a link probe's TCP connect to one target, at most


def links_limit(targets: int, bandwidth_s: float) -> float:
    """How long one host's link probe may take: the connects, then per target a timed transfer, or a
    stall's wait (deploy/host/links.py STALL_S, 2 s) where the transfer moves nothing."""
    return LINK_CONNECT_S + 10 + max(bandwidth_s, 1.0) * targets * 2
