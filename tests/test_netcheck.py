"""`fab check-network`'s pure parts: recorded outputs → records → findings, by exact equality."""

from __future__ import annotations

import hashlib
import os
import sys
import subprocess
import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from meshrun.deploy.edges import host_queries as probes
from meshrun.deploy.check.answers import machine_of
from meshrun.deploy.host.facts import machine_facts
from meshrun.deploy.errors import MeshrunError

from meshrun.deploy.check import wireguard

from meshrun.deploy.check import zerotier
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.sites import PlaceLinks
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.check.verdicts import (CLUSTER, AllReduceResult, allreduce_budget, Fingerprint, Gpu, HostFacts, LinkResult, PortState,
                             ProbeStatus, RendezvousFacts, bandwidth_findings, build_report, host_findings, link_findings,
                             link_targets, public_findings, rendezvous_findings, version_findings)
from meshrun.deploy.edges.check_probes import bounded_argv, report_order
from meshrun.deploy.edges.fanout import HostResults
from meshrun.deploy.edges.transport import CommandResult
from meshrun.layout import STATE_REFUSED_EXIT
from meshrun.deploy.edges.stdinfeed import EXEC_WITH_STDIN_ENV
from meshrun.deploy.run.plan import env_block
from meshrun.deploy.run.plan import HostLaunch
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.check import print_check
from tests.zerotier_standin import recorded

CLUSTER_NODES = {"b2c3d4e5f6": "h1", "c3d4e5f6a7": "h3"}  # the peers in tests/data/zerotier/*.json


def zt_state(scenario: str) -> zerotier.ZeroTierState:
    data = recorded(scenario)
    return zerotier.parse_state(*(json.dumps(data[sub], indent=2) for sub in zerotier.SUBCOMMANDS))


def zt_findings(scenario: str, interface: str = "ztabcdef12") -> list[Finding]:
    return zerotier.findings("h2", "10.147.17.11", zt_state(scenario), CLUSTER_NODES, interface)


def test_zerotier_online_ok_parses_and_passes() -> None:
    state = zt_state("ok")
    assert (state.node, state.state, state.version) == ("a1b2c3d4e5", zerotier.NodeState.ONLINE, "1.14.2")
    assert state.networks == (zerotier.ZtNetwork("8056c2e21c000001", "meshrun-lab", "OK", "ztabcdef12", 2800,
                                                 ("10.147.17.11", "fd80:56c2:e21c:0:199:93a1:b2c3:d4e5")),)
    assert state.peers == (zerotier.ZtPeer("62f865ae71", "PLANET", zerotier.Link.DIRECT, 88),
                           zerotier.ZtPeer("b2c3d4e5f6", "LEAF", zerotier.Link.DIRECT, 1),
                           zerotier.ZtPeer("c3d4e5f6a7", "LEAF", zerotier.Link.DIRECT, 2))
    assert zt_findings("ok") == []


def test_zerotier_offline_is_fail() -> None:
    assert zt_findings("offline") == [Finding(Level.FAIL, "h2", (
        "ZeroTier node a1b2c3d4e5 is OFFLINE (no contact with its roots); start it (`systemctl start zerotier-one`) "
        "and let UDP 9993 out; see docs/zerotier.md"))]


def test_zerotier_access_denied_is_fail_naming_the_node_to_authorize() -> None:
    assert zt_findings("access_denied") == [Finding(Level.FAIL, "h2", (
        "ZeroTier network 8056c2e21c000001 status ACCESS_DENIED; authorize node a1b2c3d4e5 in the network's "
        "controller (ZeroTier Central: Members, tick Auth)"))]


def test_zerotier_relayed_cluster_peer_is_warn() -> None:
    state = zt_state("relay")
    assert state.peers[2] == zerotier.ZtPeer("c3d4e5f6a7", "LEAF", zerotier.Link.RELAY, None)
    assert zt_findings("relay") == [Finding(Level.WARN, "h2", (
        "ZeroTier peer h3 (c3d4e5f6a7) is RELAYED, not DIRECT: slow; open UDP 9993 (or the node's ports) between "
        "the hosts, see docs/zerotier.md"))]


def test_zerotier_relay_to_a_stranger_and_wrong_interface() -> None:
    found = zerotier.findings("h2", "10.147.17.11", zt_state("relay"), {}, "eth0")
    assert found == [Finding(Level.WARN, "h2", "traffic to the rendezvous host leaves via eth0, not the ZeroTier "
                                               "device ztabcdef12: check `ip route get` on this host")]


def test_zerotier_address_not_assigned_and_garbage() -> None:
    found = zerotier.findings("h2", "10.9.9.9", zt_state("ok"), {}, None)
    assert found == [Finding(Level.FAIL, "h2", (
        "address 10.9.9.9 is not assigned by any joined ZeroTier network (joined: 8056c2e21c000001 ['10.147.17.11', "
        "'fd80:56c2:e21c:0:199:93a1:b2c3:d4e5']); fix `address` in the inventory or the network's IP assignment"))]
    broken = zerotier.parse_state("200 info a1b2c3d4e5 1.14.2 ONLINE", "[]", "[]")
    assert broken.error == "`zerotier-cli -j info` printed no JSON: '200 info a1b2c3d4e5 1.14.2 ONLINE'"


def test_wireguard_handshakes_and_unreadable() -> None:
    out = "wg0\tAbC=\t1767225590\nwg0\tDeF=\t0\n"
    state = wireguard.state_from(0, out, "", now=1767225600)
    assert state == wireguard.WireGuardState((wireguard.WgPeer("wg0", "AbC=", 10), wireguard.WgPeer("wg0", "DeF=", None)))
    assert wireguard.summary(state) == "wg0: 2 peer(s), handshakes 10 s, never"
    assert wireguard.findings("h1", state) == []
    denied = wireguard.state_from(1, "", "Unable to access interface: Operation not permitted\n", now=0)
    assert wireguard.findings("h1", denied) == [Finding(Level.WARN, "h1", (
        "WireGuard state unreadable: Unable to access interface: Operation not permitted; reading WireGuard state "
        "needs root (CAP_NET_ADMIN): log in as root or allow `wg show` via sudo"))]


def test_nvidia_smi_parse() -> None:
    out = ("0, NVIDIA H200, 1024, 143771, GPU-8d2c1f3a-55e1-9b7e-4c0d-2f6a9e1b7c44\n"
           "1, NVIDIA H200, 0, 143771, [N/A]\n")
    assert probes.parse_gpus(out) == ((0, "NVIDIA H200", 1024, 143771, "GPU-8d2c1f3a-55e1-9b7e-4c0d-2f6a9e1b7c44"),
                                      (1, "NVIDIA H200", 0, 143771, None))
    assert probes.parse_gpus("0, NVIDIA H200, 1, 2, GPU-x; rm -rf /\n") == ((0, "NVIDIA H200", 1, 2, None),)
    assert probes.parse_gpus("No devices were found\n") == ()


def facts(name: str, **changes: object) -> HostFacts:
    base = dict(name=name, address=f"10.0.0.{name[-1]}", network="lan", reachable=True, ssh_ms=3.0,
                fingerprint=Fingerprint("3.11.7", "2.14.1+cu130", "13.0", "2.30.7"), interface="eth0", mtu=1500,
                workdir="~/meshrun", disk_free_gib=50.0)
    return HostFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_the_allreduce_probe_gets_time_for_the_hosts_that_share_a_machine() -> None:
    """A CI run's 16-host check (16 namespaces on 2 CPUs) ran past the fixed 90 s (2026-12-02);
    containers on one box do the same to a user. The budget follows the most crowded machine."""
    def budget(*hosts: tuple[str | None, int | None]) -> tuple[int, int]:
        found = allreduce_budget([facts(f"h{i}", machine=m, cpus=c) for i, (m, c) in enumerate(hosts, 1)])
        return found.limit_s, found.pg_timeout_s

    a, b = "a" * 16, "b" * 16
    assert budget() == budget((None, None), (None, 8)) == (90, 30)  # older hosts: as before
    assert budget((a, 8), (b, 8), (a, 8)) == budget((a, 1), (b, 1)) == (90, 30)  # a machine each, or room
    assert budget((a, 2), (a, 2), (a, 2)) == budget(*[(a, 2)] * 4) == (90, 30)  # the 3-host test bed, as before
    assert budget(*[(a, 2)] * 8) == (180, 60)  # 4 hosts per CPU: twice the time
    assert budget((a, 2), (a, 1), (a, 4)) == (135, 45)  # judged by the fewest CPUs any of them may use
    assert budget(*[(a, 2)] * 16) == (300, 120)  # never past 5 minutes


def test_a_hosts_machine_and_cpus_are_shape_checked_and_the_probe_reports_this_ones() -> None:
    assert machine_of("h1", {}) == (None, None)  # an older probe
    assert machine_of("h1", {"machine": "0123456789abcdef", "cpus": 2}) == ("0123456789abcdef", 2)
    for bad in ({"machine": "../../etc"}, {"machine": "0123456789ABCDEF"}, {"cpus": 0}, {"cpus": 10**9},
                {"cpus": True}, {"cpus": 2.5}):
        with pytest.raises(MeshrunError, match="the facts probe"):
            machine_of("h1", bad)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert machine_facts() == {"machine": hashlib.sha256(boot.encode()).hexdigest()[:16],
                               "cpus": len(os.sched_getaffinity(0))}


def test_missing_torch_missing_gpu_and_unreachable_are_fail() -> None:
    no_torch = facts("h3", fingerprint=Fingerprint("3.11.2", error="ModuleNotFoundError: No module named 'torch'"))
    assert host_findings(no_torch, {}) == [Finding(Level.FAIL, "h3", (
        "torch is not importable by the host's python 3.11.2 (ModuleNotFoundError: No module named 'torch'); "
        "install torch there or point `python:` in the inventory at a venv that has it"))]
    gpu = facts("h1", gpus=(Gpu(0, "NVIDIA H200", 0, 143771),), selected_gpus=(0, 1))
    assert host_findings(gpu, {}) == [Finding(Level.FAIL, "h1", (
        "GPU index(es) 1 selected but not present (GPUs: 0); fix `gpus:` in the inventory or the "
        "`--hosts NAME:0,1` override"))]
    dead = facts("h2", reachable=False, error="host 'h2': no SSH answer from root@10.0.0.2:22 within 3 s")
    assert host_findings(dead, {}) == [Finding(Level.FAIL, "h2", "host 'h2': no SSH answer from root@10.0.0.2:22 within 3 s")]


def test_a_python_that_did_not_run_says_how_to_make_one_when_the_inventory_names_none() -> None:
    missing = Fingerprint(None, error="`/usr/bin/python3.12`: No such file or directory")
    assert host_findings(facts("h1", fingerprint=missing), {}) == [Finding(Level.FAIL, "h1", (
        "the host's python did not run (`/usr/bin/python3.12`: No such file or directory); set `python:` in the "
        "inventory to an interpreter that exists there"))]
    assert host_findings(facts("h1", fingerprint=missing, python_unset=True), {}) == [Finding(Level.FAIL, "h1", (
        "the host's python did not run (`/usr/bin/python3.12`: No such file or directory); it has no `python:` in "
        "the inventory: run `fab setup --hosts h1` (it makes ~/meshrun/.venv), then set "
        "`python: ~/meshrun/.venv/bin/python`"))]


def test_a_host_without_rsync_fails_before_any_sync_would() -> None:
    assert host_findings(facts("h1", rsync_missing=True), {}) == [Finding(Level.FAIL, "h1", (
        "rsync not found on the host: meshrun sends code, data and checkpoints with it; install rsync >= 3.2.3 there "
        "(apt-get install rsync)"))]
    assert host_findings(facts("h1"), {}) == []


def test_differing_versions_are_fail_but_python_patch_level_is_not() -> None:
    hosts = [facts("h1"), facts("h2", fingerprint=Fingerprint("3.11.2", "2.13.0+cpu", None, None)),
             facts("h3", fingerprint=Fingerprint("3.12.1", "2.14.1+cu130", "13.0", "2.30.7"))]
    assert version_findings(hosts) == [
        Finding(Level.FAIL, CLUSTER, "torch versions differ (h1 2.14.1+cu130, h2 2.13.0+cpu, h3 2.14.1+cu130); install "
                                     "the same version on every host (mismatched collectives hang or return garbage)"),
        Finding(Level.FAIL, CLUSTER, "python versions differ (h1 3.11, h2 3.11, h3 3.12); install the same version on "
                                     "every host (mismatched collectives hang or return garbage)"),
    ]
    assert version_findings([facts("h1"), facts("h2", fingerprint=Fingerprint("3.11.2", "2.14.1+cu130", "13.0",
                                                                              "2.30.7"))]) == []


def test_a_cpu_build_beside_cuda_builds_of_one_torch_passes_and_nccl_counts_only_on_cuda() -> None:
    """A `+cpu` laptop beside `+cu130` GPU hosts runs the job on gloo (backend auto): the same torch,
    and NCCL unused; NCCL versions matter where every host trains on CUDA."""
    gpu = (Gpu(0, "H100", 0, 81559),)
    laptop = facts("h2", fingerprint=Fingerprint("3.11.2", "2.14.1+cpu", None, None))
    assert version_findings([facts("h1", gpus=gpu), laptop]) == []
    other_nccl = facts("h2", gpus=gpu, fingerprint=Fingerprint("3.11.2", "2.14.1+cu126", "12.6", "2.26.2"))
    assert version_findings([facts("h1", gpus=gpu), other_nccl]) == [
        Finding(Level.FAIL, CLUSTER, "NCCL versions differ (h1 2.30.7, h2 2.26.2); install the same version on every "
                                     "host (mismatched collectives hang or return garbage)")]


def test_closed_ports_fail_and_lost_df_probe_warns() -> None:
    links = [LinkResult("h2", "h1", "10.0.0.1", 29400, PortState.REFUSED, rendezvous=True, detail="connection refused"),
             LinkResult("h2", "h3", "10.0.0.3", 41000, PortState.TIMEOUT, detail="no answer within 3 s"),
             LinkResult("h1", "h3", "10.0.0.3", 41000, PortState.OPEN, connect_ms=0.2, df_size=1472, df_ok=False)]
    assert link_findings(links, {"h1": 1500}) == [
        Finding(Level.FAIL, "h2 -> h1", "rendezvous port 10.0.0.1:29400 on h1 is refused (connection refused): torchrun "
                                        "cannot rendezvous; allow TCP 29400 to h1 from every host (docs/public-ip.md#ports)"),
        Finding(Level.FAIL, "h2 -> h3", "TCP to an ephemeral port on h3 (10.0.0.3:41000) is timeout (no answer within "
                                        "3 s): NCCL and gloo connect every pair on random ports; allow all TCP between "
                                        "the hosts' training addresses (docs/public-ip.md#ports)"),
        Finding(Level.WARN, "h1 -> h3", "a 1472-byte don't-fragment ping to 10.0.0.3 was lost: the path MTU is below "
                                        "h1's interface MTU 1500; large transfers may stall; lower the interface MTU "
                                        "(docs/zerotier.md#mtu)"),
    ]


def test_links_whose_bandwidth_could_not_be_timed_warn_per_host_and_reason() -> None:
    """With --bandwidth: an open link without a rate but with a reason is a WARN; a measured one, a
    closed one (its FAIL says enough) and one probed without --bandwidth (no reason) are not."""
    lost = "the transfers from h2 failed: host 'h2': the link probe failed (Killed)"
    links = [LinkResult("h1", "h2", "10.0.0.2", 41000, PortState.OPEN, connect_ms=0.2, mbit_s=940.0),
             LinkResult("h1", "h3", "10.0.0.3", 41000, PortState.OPEN, connect_ms=0.2, bandwidth_detail="Connection reset by peer"),
             LinkResult("h1", "h4", "10.0.0.4", 41000, PortState.OPEN, connect_ms=0.2, bandwidth_detail="Connection reset by peer"),
             LinkResult("h2", "h1", "10.0.0.1", 41000, PortState.OPEN, connect_ms=0.2, bandwidth_detail=lost),
             LinkResult("h2", "h3", "10.0.0.3", 41000, PortState.OPEN, connect_ms=0.2, bandwidth_detail=lost),
             LinkResult("h3", "h1", "10.0.0.1", 41000, PortState.REFUSED, detail="connection refused"),
             LinkResult("h4", "h1", "10.0.0.1", 41000, PortState.OPEN, connect_ms=0.2)]
    again = "places and the plan's floors leave those links out: run `fab check-network --bandwidth` again"
    assert bandwidth_findings(links) == [
        Finding(Level.WARN, "h1", f"bandwidth to h3, h4 not measured (Connection reset by peer); {again}"),
        Finding(Level.WARN, "h2", f"bandwidth to h1, h3 not measured ({lost}); {again}"),
    ]


def test_a_host_that_cannot_listen_on_its_own_address_is_one_fail_naming_it() -> None:
    """A listener that failed shows as a link from the host to itself (and from every other host)."""
    why = "cannot listen on 192.0.2.11 (Cannot assign requested address): `address` must be one of h1's own ..."
    links = [LinkResult("h1", "h1", "192.0.2.11", 0, PortState.ERROR, detail=why)]
    assert link_findings(links, {}) == [Finding(Level.FAIL, "h1", f"the link probe could not start on h1: {why}")]
    own_store = LinkResult("h1", "h1", "10.0.0.1", 29400, PortState.OPEN, rendezvous=True, connect_ms=0.1)
    assert link_findings([own_store], {}) == []  # the rendezvous host reaching its own store is no failure


def test_rendezvous_in_use_is_fail_and_public_rendezvous_warns() -> None:
    busy = RendezvousFacts("h1", "10.0.0.1", 29400, "in use (Address already in use)")
    assert rendezvous_findings(busy) == [Finding(Level.FAIL, "h1", (
        "rendezvous port 29400 cannot be opened on h1: in use (Address already in use); another process holds it "
        "(a run in progress?): stop it or change `rendezvous.port`"))]
    public = RendezvousFacts("h1", "8.8.4.4", 29400, "listening")
    assert [f.level for f in public_findings(public, "public")] == [Level.WARN]
    assert "unauthenticated and unencrypted" in public_findings(public, "public")[0].message
    assert "docs/public-ip.md" in public_findings(public, "public")[0].message
    assert public_findings(public, "zerotier") == []
    assert public_findings(RendezvousFacts("h1", "192.168.1.4", 29400, "listening"), "public") == []


def test_link_targets_rendezvous_first_then_every_other_host() -> None:
    ports = {"h1": ("10.0.0.1", 40001), "h2": ("10.0.0.2", 40002), "h3": ("10.0.0.3", 40003)}
    assert link_targets("h2", ports, "h1", ("10.0.0.1", 29400)) == [
        {"name": "h1", "address": "10.0.0.1", "port": 29400, "rendezvous": True},
        {"name": "h1", "address": "10.0.0.1", "port": 40001},
        {"name": "h3", "address": "10.0.0.3", "port": 40003},
    ]
    # a sampled plan (past 32 hosts, deploy/check/linkplan.py): its peers only, the rendezvous always
    assert link_targets("h2", ports, "h1", ("10.0.0.1", 29400), peers=("h3",)) == [
        {"name": "h1", "address": "10.0.0.1", "port": 29400, "rendezvous": True},
        {"name": "h3", "address": "10.0.0.3", "port": 40003},
    ]
    # in the plan's order (its peers by offset), a peer without a listener left out
    assert [t["name"] for t in link_targets("h2", ports, None, None, peers=("h3", "h1", "h4"))] == ["h3", "h1"]


def test_allreduce_runs_the_planned_torchrun_with_its_env_bounded_in_time() -> None:
    """meshrun's own variables ride on argv; the inventory's `env` (tokens) never does: it goes on
    stdin, read by EXEC_WITH_STDIN_ENV (issue 12, hole 4)."""
    host = Host("h1", "10.0.0.1", None, "root", 22, None, "/venv/bin/python", "~/meshrun", Network.LAN, None, 1,
                None, (("X", "a b;$c"),))
    launch = HostLaunch(host, True, (("GLOO_SOCKET_IFNAME", "eth0"), ("X", "a b;$c")),
                        ("/venv/bin/python", "-m", "torch.distributed.run", "--rdzv-conf", "is_host=1", "p.py"))
    assert bounded_argv(launch, 90, "/local/python") == [
        "/venv/bin/python", "-c", EXEC_WITH_STDIN_ENV, "timeout", "-k", "5", "90", "env", "GLOO_SOCKET_IFNAME=eth0",
        "/venv/bin/python", "-m", "torch.distributed.run", "--rdzv-conf", "is_host=1", "p.py"]


def test_exec_with_stdin_env_gives_the_command_the_variables_literally() -> None:
    """The real helper under a real python: the child sees the stdin variables, argv does not."""
    secret = "a b;$c\nline2"
    done = subprocess.run([sys.executable, "-c", EXEC_WITH_STDIN_ENV, sys.executable, "-c",
                           "import os, sys; print(repr(os.environ['X'])); print(repr(sys.argv))"],
                          input=env_block(Host("h1", "10.0.0.1", None, "root", 22, None, None, "~", Network.LAN, None,
                                               1, None, (("X", secret),))), capture_output=True, check=True)
    assert done.stdout.decode().splitlines() == [repr(secret), "['-c']"]


@pytest.mark.parametrize("scenario,level", [("ok", Level.PASS), ("offline", Level.FAIL),
                                            ("access_denied", Level.FAIL), ("relay", Level.WARN)])
def test_zerotier_scenarios_decide_the_report(scenario: str, level: Level) -> None:
    h2 = facts("h2", address="10.147.17.11", network="zerotier", interface="ztabcdef12", mtu=2800,
               zerotier=zt_state(scenario))
    peers = [facts("h1"), facts("h3")]
    report = build_report((peers[0], h2, peers[1]), None, (), AllReduceResult(ProbeStatus.SKIPPED), "lan", 1.0)
    nodes_named = {"b2c3d4e5f6": "h1", "c3d4e5f6a7": "h3"}
    direct = host_findings(h2, {**nodes_named, "a1b2c3d4e5": "h2"})
    assert report.level is (level if scenario != "relay" else Level.PASS)  # strangers' relays do not count
    assert [f.level for f in direct] == ([] if level is Level.PASS else [level])


def test_the_report_states_the_link_rule_by_site_past_32_hosts() -> None:
    """The rule in the summary and --json follows the inventory's sites, as the probe did."""
    names = [f"h{i}" for i in range(1, 41)]
    links = tuple(LinkResult(n, "h1", "10.0.0.1", 40001, PortState.OPEN, connect_ms=0.3) for n in names)
    skipped = AllReduceResult(ProbeStatus.SKIPPED)
    sites = {n: ("office" if i < 20 else "home") for i, n in enumerate(names)}
    by_site = build_report((), None, links, skipped, "lan", 1.0, sites)
    assert by_site.links_rule.startswith("sampled by site, of 1560 pairs (2 sites): ")
    assert build_report((), None, links, skipped, "lan", 1.0).links_rule.startswith("sampled, of 1560 pairs: ")


def test_report_renders_tables_matrix_findings_and_summary() -> None:
    links = (LinkResult("h1", "h2", "10.0.0.2", 40002, PortState.OPEN, connect_ms=0.25, df_size=1472, df_ok=True),
             LinkResult("h2", "h1", "10.0.0.1", 40001, PortState.REFUSED, detail="connection refused"),
             LinkResult("h2", "h1", "10.0.0.1", 29400, PortState.OPEN, rendezvous=True, connect_ms=0.3))
    report = build_report((facts("h1"), facts("h2")), RendezvousFacts("h1", "10.0.0.1", 29400, "listening"), links,
                          AllReduceResult(ProbeStatus.SKIPPED, "not run: fix the failures above first"), "lan", 2.5)
    out = io.StringIO()
    print_check(Renderer(Console(file=out, width=160, highlight=False)), report)
    text = out.getvalue()
    assert "h1 (10.0.0.1, lan): PASS" in text and "h2 (10.0.0.2, lan): PASS" in text  # link findings are per pair
    assert "FAIL h2 -> h1: TCP to an ephemeral port on h1 (10.0.0.1:40001) is refused" in text
    assert "0.25 ms, DF 1472 ok" in text and "refused" in text
    assert "end to end: gloo all-reduce skipped: not run: fix the failures above first" in text
    assert text.rstrip().endswith("check-network FAIL: 2 host(s), 2 link(s) probed (every pair), 1 failure(s), 0 warning(s), 2.5 s")


def test_report_renders_the_matrix_by_site() -> None:
    """With sites declared, a table sums the matrix up inside each site and between each two."""
    report = replace(build_report((facts("h1"), facts("h2")), None, (), AllReduceResult(ProbeStatus.SKIPPED), "lan",
                                  1.0), places=(PlaceLinks("office", "office", 1, 940.4, 0.21),
                                                PlaceLinks("office", "home", 2, None, 41.57)))
    out = io.StringIO()
    print_check(Renderer(Console(file=out, width=160, highlight=False)), report)
    rows = [" ".join(line.replace("│", " ").split()) for line in out.getvalue().splitlines()]
    assert "inside office 1 940 Mbit/s 0.21 ms" in rows and "office <-> home 2 - 41.57 ms" in rows, rows


def test_zerotier_cli_failures_name_their_fix() -> None:
    """zerotier-cli's own words tell a stopped daemon from a missing auth token; host output is
    shown escaped."""
    from meshrun.deploy.check.zerotier import cli_failure
    stopped = cli_failure("zerotier-cli", "info", "Error connecting to the ZeroTier service: connection failed\n")
    assert stopped == ("the ZeroTier service is not running (`zerotier-cli -j info`: Error connecting to the ZeroTier "
                       "service: connection failed); start it: `systemctl start zerotier-one` (or `zerotier-one -d`)")
    denied = cli_failure("zerotier-cli", "info", "401 \x1b]0;pwned\x07")
    assert denied == ("`zerotier-cli -j info` failed (401 \\x1b]0;pwned\\x07); it needs root or a copy of "
                      "authtoken.secret in ~/.zeroTierOneAuthToken")


def test_the_allreduce_reports_a_refused_rendezvous_state_before_the_timeouts_it_causes() -> None:
    """A planted state read by h2 and h3 but not by h1 (it had read the honest one): h1 waits out
    the store and fails with a timeout, h2 and h3 refuse. The refusal is the cause and is named;
    without one, host order."""
    timeout, refused = CommandResult(1, "", "DistStoreError: wait timeout"), CommandResult(STATE_REFUSED_EXIT, "", "refused")
    mixed = HostResults([("h1", timeout), ("h2", CommandResult(0, "", "")), ("h3", refused)])
    assert report_order(mixed) == ["h3", "h1", "h2"]
    lost = HostResults([("h1", MeshrunError("host 'h1': lost")), ("h2", timeout)])
    assert report_order(lost) == ["h1", "h2"]
