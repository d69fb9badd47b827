"""Two selected hosts reporting one ZeroTier node id (a cloned VM image, or a host answering
falsely): the check WARNs naming both and the id, and no relay warning pins that id on either,
which would send the user to open UDP 9993 on the wrong host. Pure, by exact equality."""

from __future__ import annotations

from meshrun.deploy.check import zerotier
from meshrun.deploy.check.findings import Level, warn
from meshrun.deploy.check.verdicts import (CLUSTER, AllReduceResult, Fingerprint, HostFacts, ProbeStatus,
                                           build_report)
from meshrun.deploy.check.zerotier import Link, NodeState, ZeroTierState, ZtNetwork, ZtPeer

GPU1, GPU2, GPU3 = "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"


def zt_host(name: str, address: str, node: str, peers: tuple[ZtPeer, ...] = ()) -> HostFacts:
    network = ZtNetwork("8056c2e21c000001", "lab", "OK", "ztabcdef12", 2800, (address,))
    return HostFacts(name=name, address=address, network="zerotier", reachable=True, ssh_ms=3.0,
                     fingerprint=Fingerprint("3.11.7", "2.14.1+cu130", "13.0", "2.30.7"), interface="ztabcdef12",
                     mtu=2800, workdir="~/meshrun", disk_free_gib=50.0,
                     zerotier=ZeroTierState(node, NodeState.ONLINE, "1.14.2", (network,), peers))


def report_for(gpu2_node: str):
    """gpu3's path to gpu1's node is RELAYED; gpu2 says its node id is `gpu2_node`."""
    gpu3_peers = (ZtPeer(GPU1, "LEAF", Link.RELAY, None), ZtPeer(GPU2, "LEAF", Link.DIRECT, 1))
    hosts = (zt_host("gpu1", "10.147.17.1", GPU1), zt_host("gpu2", "10.147.17.2", gpu2_node),
             zt_host("gpu3", "10.147.17.3", GPU3, gpu3_peers))
    return build_report(hosts, None, (), AllReduceResult(ProbeStatus.SKIPPED), "zerotier", 1.0)


def twins(names: str, node: str) -> object:
    return warn(CLUSTER, f"{names} report ZeroTier node id {node}: a node id belongs to one ZeroTier identity, so one "
                         "host runs a copy of another's (a cloned disk or VM image) or answers falsely, and relays to "
                         "that id cannot be pinned on one host; on the host that should differ, stop zerotier-one, "
                         "delete identity.public and identity.secret in /var/lib/zerotier-one, start it and "
                         "authorize its new node id")


def test_honest_ids_name_the_relayed_peer() -> None:
    assert list(report_for(GPU2).findings) == [warn("gpu3", (
        f"ZeroTier peer gpu1 ({GPU1}) is RELAYED, not DIRECT: slow; open UDP 9993 (or the node's ports) between the "
        "hosts, see docs/zerotier.md"))]


def test_a_claimed_id_is_said_and_names_no_peer() -> None:
    report = report_for(GPU1)  # gpu2 claims gpu1's node id
    assert (report.level, list(report.findings)) == (Level.WARN, [twins("gpu1 and gpu2 both", GPU1)])
    assert not any("RELAYED" in f.message for f in report.findings)


def test_three_claims_are_one_warning_and_unique_ids_still_name_their_host() -> None:
    claims = (("gpu1", GPU1), ("gpu2", GPU1), ("gpu3", GPU1), ("gpu4", GPU3), ("gpu5", None))
    assert zerotier.node_names(claims, CLUSTER) == ({GPU3: "gpu4"}, [twins("gpu1, gpu2 and gpu3 all", GPU1)])
