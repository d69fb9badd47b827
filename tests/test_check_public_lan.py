"""`network: lan` (the default) on public addresses: two cloud machines listed by their public IPs,
no `network:` written. The store, the elastic run's second store and gloo are open to the internet,
so the check warns on the address, not on the label, and the exposure check probes such hosts.
An office LAN (private, CGNAT, ZeroTier or ULA addresses) stays quiet. Pure, by exact equality."""

from __future__ import annotations

import pytest

from meshrun.deploy.check.exposure import (FIX, ExposureProbe, ExposureResult, ExposureTarget, exposure_findings,
                                           exposure_targets, is_probed, public_addresses)
from meshrun.deploy.check.findings import Level, warn
from meshrun.deploy.check.verdicts import (CLUSTER, AllReduceResult, Fingerprint, HostFacts, LinkResult, PortState,
                                           ProbeStatus, RendezvousFacts, build_report, public_findings)
from meshrun.deploy.inventory.model import Host, Network

EPHEMERAL = "an ephemeral port (gloo, an elastic run's extra store)"
STORE = "the rendezvous store's port"
DANGER = ("the c10d store (TCPStore) is unauthenticated and unencrypted, and object collectives unpickle, so anyone "
          "who reaches the port can run code on your hosts; ")


def facts(name: str, address: str, network: str = "lan") -> HostFacts:
    return HostFacts(name=name, address=address, network=network, reachable=True, ssh_ms=3.0,
                     fingerprint=Fingerprint("3.11.7", "2.14.1+cu130", "13.0", "2.30.7"), interface="eth0", mtu=1500,
                     workdir="~/meshrun", disk_free_gib=50.0)


def report_for(first: str, second: str, network: str = "lan"):
    """Two healthy hosts, every link open, the store listening on the first."""
    hosts = (facts("gpu1", first, network), facts("gpu2", second, network))
    links = (LinkResult("gpu2", "gpu1", first, 29400, PortState.OPEN, rendezvous=True, connect_ms=0.4),
             LinkResult("gpu1", "gpu2", second, 40002, PortState.OPEN, connect_ms=0.4),
             LinkResult("gpu2", "gpu1", first, 40001, PortState.OPEN, connect_ms=0.4))
    return build_report(hosts, RendezvousFacts("gpu1", first, 29400, "listening"), links,
                        AllReduceResult(ProbeStatus.OK, seconds=1.0, world_size=2), network, 1.0)


def test_public_addresses_under_the_default_lan_label_warn_with_the_fix() -> None:
    report = report_for("93.184.216.34", "93.184.216.35")
    assert (report.level, list(report.findings)) == (Level.WARN, [warn(CLUSTER, (
        "the rendezvous is on public address 93.184.216.34:29400 (gpu1) with `network: lan`: " + DANGER
        + "set `network: public` and run `fab firewall up` (it lets only your hosts in) or use an overlay "
        "(docs/public-ip.md, docs/zerotier.md)"))])


def test_the_public_label_keeps_its_own_words() -> None:
    assert public_findings(RendezvousFacts("gpu1", "2001:4860::8", 29400, "listening"), "public") == [warn(CLUSTER, (
        "the rendezvous is on public address 2001:4860::8:29400 (gpu1) with `network: public`: " + DANGER
        + "firewall it to your hosts or use an overlay (docs/public-ip.md, docs/zerotier.md)"))]


@pytest.mark.parametrize("first,second", [("192.168.1.4", "192.168.1.5"), ("10.147.17.5", "10.147.17.6"),
                                          ("100.64.3.1", "100.64.3.2"), ("fd80:56c2:e21c::1", "fd80:56c2:e21c::2"),
                                          ("172.16.0.1", "172.16.0.2"), ("gpu1.lab", "gpu2.lab")])
def test_an_office_lan_on_private_cgnat_zerotier_or_ula_addresses_stays_quiet(first: str, second: str) -> None:
    report = report_for(first, second)
    assert (report.level, report.findings) == (Level.PASS, ())


def test_an_overlay_label_is_left_to_the_overlay_s_own_route_checks() -> None:
    rdzv = RendezvousFacts("gpu1", "93.184.216.34", 29400, "listening")
    assert (public_findings(rdzv, "zerotier"), public_findings(rdzv, "wireguard")) == ([], [])


def lan_host(address: str, ssh_address: str | None = None) -> Host:
    return Host(name="gpu1", address=address, ssh_address=ssh_address, user=None, port=None, identity=None,
                python=None, workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


def test_a_lan_host_on_a_public_address_is_probed_from_a_stranger_controller() -> None:
    assert (is_probed(lan_host("93.184.216.34")), is_probed(lan_host("93.184.216.34"), controller_is_member=True)) == (
        True, False)  # a member controller is let in by the firewall, rightly: its answer proves nothing
    assert is_probed(lan_host("192.168.1.4", ssh_address="93.184.216.34"))  # SSH in over the internet, LAN inside
    for quiet in (lan_host("192.168.1.4"), lan_host("100.64.3.1", "10.0.0.9"), lan_host("fd80::1"),
                  lan_host("local", "93.184.216.34")):
        assert not is_probed(quiet), quiet


def test_a_public_lan_host_s_targets_are_its_public_addresses_and_an_answer_warns() -> None:
    gpu1 = lan_host("93.184.216.34", ssh_address="93.184.216.34")
    # a lan has no overlay interface to leave out: the public IPv6 beside the address is as open
    reported = (("lo", "127.0.0.1"), ("eth0", "93.184.216.34"), ("eth0", "2001:4860::8"), ("eth1", "192.168.1.4"))
    assert public_addresses(gpu1, reported) == ("2001:4860::8",)
    assert exposure_targets(gpu1, 41234, 29400, ("2001:4860::8",)) == tuple(
        ExposureTarget("gpu1", a, p, what, overlay=False, lan=True)
        for a in ("93.184.216.34", "2001:4860::8") for p, what in ((29400, STORE), (41234, EPHEMERAL)))
    # SSH over a public address, training on the LAN: only the public one is a stranger's way in
    assert exposure_targets(lan_host("192.168.1.4", "93.184.216.35"), 41234, None) == (
        ExposureTarget("gpu1", "93.184.216.35", 41234, EPHEMERAL, overlay=False, lan=True),)
    assert exposure_targets(lan_host("192.168.1.4"), 41234, 29400, ("2001:4860::8",)) == ()
    target = ExposureTarget("gpu1", "93.184.216.34", 29400, STORE, overlay=False, lan=True)
    assert exposure_findings(ExposureProbe((ExposureResult(target, "open"),))) == [warn("gpu1", (
        f"93.184.216.34:29400 ({STORE}) answers this controller, which is not one of the hosts: the host has a "
        "public address, so whatever `network: lan` says anyone on the internet can reach torch's unauthenticated "
        f"store and gloo the same way; set `network: public` and {FIX}"))]
