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


def link_plan(names: Sequence[str]) -> LinkPlan:
    n = len(names)
    if n <= ALL_PAIRS_MAX_HOSTS:
        steps: tuple[int, ...] = tuple(range(1, n))
        return LinkPlan({names[i]: tuple(names[(i + d) % n] for d in steps) for i in range(n)}, "every pair")
    steps = offsets(n)
    peers = {names[i]: tuple(names[(i + d) % n] for d in steps) for i in range(n)}
    return LinkPlan(peers, f"sampled, of {n * (n - 1)} pairs: each host to the hosts "
                           f"{', '.join(map(str, steps[:3]))}, … {steps[-1]} places after it in inventory order; "
                           f"every pair up to {ALL_PAIRS_MAX_HOSTS} hosts")
