"""`fab check-network`'s links, pure: what one connect from a host found (LinkResult), the size of
its don't-fragment probe, and the verdicts on links and on their timed transfers. Split from
verdicts.py, which imports these names back: `from meshrun.deploy.check.verdicts import LinkResult`
keeps working. Nothing here touches the network (deploy/host/links.py does, on the hosts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping

from meshrun.deploy.check.findings import Finding, fail, warn

PORTS_DOC = "docs/public-ip.md#ports"
MTU_DOC = "docs/zerotier.md#mtu"
ICMP_HEADER = 8
IPV4_HEADER, IPV6_HEADER = 20, 40
# deploy/host/links.py's word for a transfer the far end acknowledged none of (it cannot import
# this: it runs alone on the host); tests/test_bulk_stall.py holds the two the same.
STALLED = "the transfer stalled: the far end acknowledged none of it"


class PortState(str, Enum):
    OPEN = "open"
    REFUSED = "refused"  # nothing listens, or a firewall rejects
    TIMEOUT = "timeout"  # dropped on the way: a firewall, a cut link, a wrong route
    UNREACHABLE = "unreachable"  # no route to the address
    ERROR = "error"
    SKIPPED = "skipped"  # not tried: one end failed earlier


@dataclass(frozen=True)
class LinkResult:
    """One directed TCP connect (and probes) from `source` to a port on `target`."""

    source: str
    target: str
    address: str
    port: int
    state: PortState
    rendezvous: bool = False  # the rendezvous port, not an ephemeral one
    connect_ms: float | None = None  # TCP handshake time: one round trip
    detail: str = ""
    df_size: int | None = None  # ICMP payload of the don't-fragment probe (`df_payload`)
    df_ok: bool | None = None  # None: not probed, or not tested (`df_detail` says why)
    mbit_s: float | None = None  # with --bandwidth
    bandwidth_detail: str = ""  # with --bandwidth, an open link's transfer that could not be timed: why
    df_detail: str = ""  # df_ok None after a probe: why the path MTU was not tested (no ping, ICMP filtered)


def df_payload(mtu: int | None, address: str) -> int | None:
    """The ICMP payload of a ping that fills `mtu` exactly on its way to `address`: the MTU less ICMP's
    header and the IP header of the address's family. IPv6's is 20 bytes longer than IPv4's: sized
    for IPv4, every IPv6 probe was too big for the sender's own interface ("message too long") and
    read as a path below the MTU, whatever the MTU. None without an MTU: nothing to probe."""
    if not mtu:
        return None
    return mtu - ICMP_HEADER - (IPV6_HEADER if ":" in address else IPV4_HEADER)


def df_targets(targets: list[dict], mtu: int | None) -> list[dict]:
    """`targets` (verdicts.link_targets'), each ephemeral one with its don't-fragment payload
    (`df_size`, by its address's family). The rendezvous port's host is pinged as an ephemeral target."""
    return [t if t.get("rendezvous") or not mtu else {**t, "df_size": df_payload(mtu, t["address"])}
            for t in targets]


def link_findings(links: Iterable[LinkResult], mtus: Mapping[str, int | None]) -> list[Finding]:
    links, found = list(links), []
    for link in links:
        where = f"{link.source} -> {link.target}"
        detail = f" ({link.detail})" if link.detail else ""
        if link.state is PortState.SKIPPED:
            continue
        if link.source == link.target and not link.rendezvous:  # a host whose own listener failed
            found.append(fail(link.source, f"the link probe could not start on {link.source}: {link.detail}"))
            continue
        if link.state is not PortState.OPEN and link.rendezvous:
            found.append(fail(where, f"rendezvous port {link.address}:{link.port} on {link.target} is {link.state.value}"
                                     f"{detail}: torchrun cannot rendezvous; allow TCP {link.port} to {link.target} "
                                     f"from every host ({PORTS_DOC})"))
        elif link.state is not PortState.OPEN:
            found.append(fail(where, f"TCP to an ephemeral port on {link.target} ({link.address}:{link.port}) is "
                                     f"{link.state.value}{detail}: NCCL and gloo connect every pair on random ports; "
                                     f"allow all TCP between the hosts' training addresses ({PORTS_DOC})"))
        if link.df_ok is False:  # the host saw a small ping pass: the loss is the size's
            found.append(warn(where, f"a {link.df_size}-byte don't-fragment ping to {link.address} was lost: the path "
                                     f"MTU is below {link.source}'s interface MTU {mtus.get(link.source)}; large "
                                     f"transfers may stall; lower the interface MTU ({MTU_DOC})"))
    return found + untested_mtu_findings(links)


def untested_mtu_findings(links: Iterable[LinkResult]) -> list[Finding]:
    """A WARN per host and reason for the open links whose path MTU was not tested: no `ping` there,
    or even a small ping lost (ICMP filtered, a ping that cannot run). No MTU advice: nothing says
    the MTU is wrong, only that a black hole there would go unseen, which a bulk transfer shows."""
    untested: dict[tuple[str, str], list[str]] = {}
    for link in links:
        if link.df_ok is None and link.df_detail and link.state is PortState.OPEN and not link.rendezvous:
            untested.setdefault((link.source, link.df_detail), []).append(link.target)
    return [warn(source, f"the path MTU to {', '.join(targets)} was not tested: {why}; `fab check-network "
                         "--bandwidth` tests the path with a bulk transfer instead")
            for (source, why), targets in untested.items()]


def bandwidth_findings(links: Iterable[LinkResult]) -> list[Finding]:
    """With --bandwidth, per host and reason, the open links whose transfer could not be timed. One
    the far end acknowledged none of, after a handshake that passed, is a FAIL: small packets pass
    and full-size ones are lost (a path-MTU black hole), and training would hang on its first large
    collective until its timeout. Any other reason is a WARN: the places found and the plan's floors
    stand on fewer links."""
    unmeasured: dict[tuple[str, str], list[str]] = {}
    for link in links:
        if link.bandwidth_detail and link.mbit_s is None and link.state is PortState.OPEN and not link.rendezvous:
            unmeasured.setdefault((link.source, link.bandwidth_detail), []).append(link.target)
    return [fail(source, f"TCP connects to {', '.join(targets)} but a bulk transfer stalls: nothing sent was "
                         "acknowledged, the mark of a path-MTU black hole (small packets pass, full-size ones are "
                         "lost), and training would hang on its first large collective; lower the MTU of the "
                         f"training interface on the hosts ({MTU_DOC})")
            if why == STALLED else
            warn(source, f"bandwidth to {', '.join(targets)} not measured ({why}); places and the plan's floors "
                         "leave those links out: run `fab check-network --bandwidth` again")
            for (source, why), targets in unmeasured.items()]
