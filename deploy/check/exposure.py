"""The exposure check's verdicts (issue 12, hole 6), pure.

torch's store listens on every address whatever `--local-addr` says, an elastic run adds a second
store on a random port, and gloo listens on ephemeral ports. On an overlay (zerotier, wireguard)
only the overlay should reach them. From the controller, which is not on the overlay's private
path, the check connects to each host's other addresses (its `ssh_address`, and the public
addresses the host reports off its overlay interface) on the rendezvous port and on an ephemeral
port where a bait listens on every address: any answer FAILs.

On `network: public` the training addresses are public themselves, so there is no private path:
the controller, when it is not one of the hosts, stands for any stranger on the internet. It tries
each host's `address` (and the others above) the same way; an answer is a WARN, since an open
port there is what `fab firewall up` is for, not a broken overlay. So is a `network: lan` host (the
default, which nobody writes for two cloud machines) whose `address` or `ssh_address` is public:
those public addresses and the ones it reports are tried, and an answer WARNs with the advice to
say `network: public` too. A lan host on private addresses only is not probed: an office LAN's
store is for its neighbours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from meshrun.deploy.check.findings import Finding, fail, warn, worst
from meshrun.deploy.check.verdicts import CheckReport, is_public
from meshrun.deploy.inventory.model import Host, Network

OVERLAYS = (Network.ZEROTIER, Network.WIREGUARD)
FIX = "close it: fab firewall up (docs/security.md#the-network-is-the-boundary-exposure-check-and-fab-firewall)"


@dataclass(frozen=True)
class ExposureTarget:
    host: str
    address: str  # an address of the host off the overlay (`network: public`: any of its addresses; lan: a public one)
    port: int
    what: str  # which listener the port stands for, for the message
    overlay: bool = True  # the host is on an overlay: an answer FAILs (else, `network: public` or `lan`, WARNs)
    lan: bool = False  # the host says `network: lan` of a public address: the advice is to say `public`


@dataclass(frozen=True)
class ExposureResult:
    target: ExposureTarget
    state: str  # "open", "refused", "timeout", "unreachable", "error"


def is_probed(host: Host, controller_is_member: bool = False) -> bool:
    """An overlay host has a path its stores should be closed to; a public one, or a `lan` one with
    a public `address` or `ssh_address`, is probed from a controller that is not itself a member (a
    member is let in, rightly). A local one has no SSH."""
    if host.is_local:
        return False
    # A name is not resolved here; a private, CGNAT (100.64/10) or ULA address is a LAN's own.
    public = host.network is Network.PUBLIC or is_public(host.address) or is_public(host.ssh_address or "")
    return host.network in OVERLAYS or (public and not controller_is_member)


def exposed_addresses(host: Host) -> tuple[str, ...]:
    """The host's addresses that the inventory names and a stranger could use: on an overlay its
    `ssh_address` (when it is not the overlay address); on `network: public` its address too; on
    `lan` the public ones of the two (a private one is the LAN's own)."""
    if host.network is Network.LAN:
        return tuple(dict.fromkeys(a for a in (host.address, host.ssh_address) if a and is_public(a)))
    names = (host.address,) if host.network is Network.PUBLIC else ()
    if host.ssh_address and host.ssh_address != host.address:
        names += (host.ssh_address,)
    return names


MAX_PUBLIC_ADDRESSES = 4  # the host names them: it must not turn the controller into its port scanner


def public_addresses(host: Host, reported: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The public (globally routed) addresses among the host's reported (interface, address) pairs,
    on an overlay off the interface that holds its overlay address (off-overlay hosts have no such
    private interface: a public IPv6 beside a LAN address is as open), at most MAX_PUBLIC_ADDRESSES."""
    on_overlay = host.network in OVERLAYS
    overlay = {ifname for ifname, address in reported if on_overlay and address == host.address}
    found: list[str] = []
    for ifname, address in reported:
        if ifname not in overlay and is_public(address) and address not in (host.address, host.ssh_address, *found):
            found.append(address)
    return tuple(found[:MAX_PUBLIC_ADDRESSES])


def exposure_targets(host: Host, ephemeral: int, rendezvous: int | None,
                     public: tuple[str, ...] = ()) -> tuple[ExposureTarget, ...]:
    if not is_probed(host):
        return ()
    ports = ([(rendezvous, "the rendezvous store's port")] if rendezvous is not None else []) + [
        (ephemeral, "an ephemeral port (gloo, an elastic run's extra store)")]
    return tuple(ExposureTarget(host.name, address, port, what, host.network in OVERLAYS, host.network is Network.LAN)
                 for address in (*exposed_addresses(host), *public) for port, what in ports)


def busy_rendezvous(host: str, port: int) -> Finding:
    """The bait could not take the rendezvous port: only the ephemeral one was tried."""
    return warn(host, f"the exposure check could not listen on the rendezvous port {port} (in use: a run?), so it "
                      "tried an ephemeral port only; run check-network again when no run holds the port")


@dataclass(frozen=True)
class ExposureProbe:
    """What the exposure check found: each connect's result, the hosts whose bait could not take the
    rendezvous port (host, port), and the hosts it could not probe at all (host, why)."""

    results: tuple[ExposureResult, ...] = ()
    busy: tuple[tuple[str, int], ...] = ()
    unprobed: tuple[tuple[str, str], ...] = ()


def _answer(target: ExposureTarget) -> Finding:
    if target.overlay:
        return fail(target.host, f"{target.address}:{target.port} ({target.what}) answers off the overlay: torch's "
                                 "store and gloo are unauthenticated, whoever reaches them can join or poison the job; "
                                 f"{FIX}")
    if target.lan:
        return warn(target.host, f"{target.address}:{target.port} ({target.what}) answers this controller, which is "
                                 "not one of the hosts: the host has a public address, so whatever `network: lan` "
                                 "says anyone on the internet can reach torch's unauthenticated store and gloo the "
                                 f"same way; set `network: public` and {FIX}")
    return warn(target.host, f"{target.address}:{target.port} ({target.what}) answers this controller, which is not "
                             "one of the hosts: with `network: public` anyone on the internet can reach torch's "
                             f"unauthenticated store and gloo the same way; {FIX}")


def exposure_findings(probe: ExposureProbe) -> list[Finding]:
    return [*(_answer(r.target) for r in probe.results if r.state == "open"),
            *(busy_rendezvous(host, port) for host, port in probe.busy),
            *(warn(host, f"the exposure check could not run: {why}") for host, why in probe.unprobed)]


def with_findings(report: CheckReport, extra: list[Finding]) -> CheckReport:
    findings = (*report.findings, *extra)
    return dataclasses.replace(report, findings=findings, level=worst(f.level for f in findings))
