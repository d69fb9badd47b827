"""`network: wireguard` must really run over WireGuard: an `address:` that is the peer's public (or
LAN) IP routes training by eth0, in clear text, beside a live wg0. The check FAILs naming the
interface and saying to use the WireGuard addresses. Pure, by exact equality."""

from __future__ import annotations

from meshrun.deploy.check import wireguard
from meshrun.deploy.check.findings import Level, fail, warn
from meshrun.deploy.check.verdicts import (AllReduceResult, Fingerprint, HostFacts, LinkResult, PortState,
                                           ProbeStatus, RendezvousFacts, build_report)
from meshrun.deploy.check.wireguard import WgPeer, WireGuardState

LIVE = WireGuardState((WgPeer("wg0", "AbC=", 5), WgPeer("wg0", "DeF=", 7)))


def facts(name: str, address: str, interface: str | None, state: WireGuardState = LIVE) -> HostFacts:
    return HostFacts(name=name, address=address, network="wireguard", reachable=True, ssh_ms=3.0,
                     fingerprint=Fingerprint("3.11.7", "2.14.1+cu130", "13.0", "2.30.7"), interface=interface,
                     mtu=1420, workdir="~/meshrun", disk_free_gib=50.0, wireguard=state)


def report_for(first: str, second: str, interface: str):
    hosts = (facts("gpu1", first, interface), facts("gpu2", second, interface))
    links = (LinkResult("gpu2", "gpu1", first, 29400, PortState.OPEN, rendezvous=True, connect_ms=0.4),
             LinkResult("gpu1", "gpu2", second, 40002, PortState.OPEN, connect_ms=0.4),
             LinkResult("gpu2", "gpu1", first, 40001, PortState.OPEN, connect_ms=0.4))
    return build_report(hosts, RendezvousFacts("gpu1", first, 29400, "listening"), links,
                        AllReduceResult(ProbeStatus.SKIPPED), "wireguard", 1.0)


def outside(host: str) -> object:
    return fail(host, "traffic to the rendezvous host leaves via eth0, not a WireGuard interface (wg0): training "
                      "would run outside the tunnel, unencrypted; set `address:` in the inventory to each host's "
                      "WireGuard address (the one on wg0 there)")


def test_public_addresses_routed_by_eth0_beside_a_live_tunnel_fail_on_every_host() -> None:
    report = report_for("93.184.216.34", "93.184.216.35", "eth0")
    assert (report.level, list(report.findings)) == (Level.FAIL, [outside("gpu1"), outside("gpu2")])


def test_a_lan_address_routed_beside_the_tunnel_fails_the_same() -> None:
    assert list(report_for("192.168.1.4", "192.168.1.5", "eth0").findings) == [outside("gpu1"), outside("gpu2")]


def test_the_wireguard_addresses_routed_by_wg0_pass() -> None:
    report = report_for("10.0.0.1", "10.0.0.2", "wg0")
    assert (report.level, report.findings) == (Level.PASS, ())


def test_any_interface_wg_show_lists_counts() -> None:
    two = WireGuardState((WgPeer("wg0", "AbC=", 5), WgPeer("wg-train", "DeF=", None)))
    assert wireguard.findings("gpu1", two, "wg-train") == []
    assert wireguard.findings("gpu1", two, "eth0") == [fail("gpu1", (
        "traffic to the rendezvous host leaves via eth0, not a WireGuard interface (wg-train, wg0): training would "
        "run outside the tunnel, unencrypted; set `address:` in the inventory to each host's WireGuard address (the "
        "one on wg-train there)"))]


def test_without_the_interfaces_or_the_route_nothing_is_claimed_about_it() -> None:
    """An unreadable state or an empty peer list names no interfaces; no route is the route check's FAIL."""
    unreadable = WireGuardState(error="Operation not permitted")
    assert wireguard.findings("gpu1", unreadable, "eth0") == [warn("gpu1", (
        "WireGuard state unreadable: Operation not permitted"))]
    assert wireguard.findings("gpu1", WireGuardState(), "eth0") == [warn("gpu1", (
        "`wg show` lists no WireGuard peers: is the tunnel up on this host?"))]
    assert wireguard.findings("gpu1", LIVE, None) == []
