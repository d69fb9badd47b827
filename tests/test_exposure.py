"""The exposure check (issue 12, hole 6a): on an overlay inventory, check-network connects from the
controller (not on the overlay) to each host's `ssh_address`, and to the public addresses the host
reports off its overlay interface, on the rendezvous port and on an ephemeral port where a bait
listens on every address, as torch's stores and gloo do; an answer FAILs, naming the host,
address, port and the fix. Pure verdicts by exact equality, then the real
thing on the simulated cluster over wireguard-go, before and after `fab firewall up`."""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.check.exposure import (FIX, ExposureProbe, ExposureResult, ExposureTarget, busy_rendezvous, exposure_findings,
                                           exposure_targets, is_probed, public_addresses)
from meshrun.deploy.check.findings import fail, warn
from meshrun.deploy.inventory.model import Host, Network
from tests.fabrun import fab

EPHEMERAL = "an ephemeral port (gloo, an elastic run's extra store)"


def host(network: Network, ssh_address: str | None) -> Host:
    return Host(name="gpu1", address="10.147.17.5", ssh_address=ssh_address, user=None, port=None, identity=None,
                python=None, workdir="~/meshrun", network=network, gpus=None, nproc=None, batch_size=None, env=())


def test_targets_are_the_off_overlay_address_on_each_bait_port() -> None:
    assert exposure_targets(host(Network.WIREGUARD, "203.0.113.7"), 41234, 29400) == (
        ExposureTarget("gpu1", "203.0.113.7", 29400, "the rendezvous store's port"),
        ExposureTarget("gpu1", "203.0.113.7", 41234, EPHEMERAL))
    assert exposure_targets(host(Network.ZEROTIER, "203.0.113.7"), 41234, None) == (
        ExposureTarget("gpu1", "203.0.113.7", 41234, EPHEMERAL),)
    assert exposure_targets(host(Network.LAN, "203.0.113.7"), 41234, 29400) == ()
    assert exposure_targets(host(Network.ZEROTIER, None), 41234, 29400) == ()


def test_public_addresses_off_the_overlay_interface_are_targets_too() -> None:
    reported = (("lo", "127.0.0.1"), ("zt0", "10.147.17.5"), ("zt0", "192.0.0.9"), ("eth0", "192.168.1.4"),
                ("eth0", "8.8.4.4"), ("eth0", "2001:4860::8"), ("eth0", "fe80::1"), ("eth0", "203.0.113.7"),
                ("eth1", "not an address"), ("eth1", "8.8.4.4"))
    # zt0 carries the overlay address: its other addresses are the overlay's; private, link-local and
    # documentation addresses are not public; the ssh_address is already a target; duplicates once.
    gpu1 = host(Network.ZEROTIER, "203.0.113.7")
    assert public_addresses(gpu1, reported) == ("8.8.4.4", "2001:4860::8")
    assert exposure_targets(gpu1, 41234, None, public_addresses(gpu1, reported)) == (
        ExposureTarget("gpu1", "203.0.113.7", 41234, EPHEMERAL), ExposureTarget("gpu1", "8.8.4.4", 41234, EPHEMERAL),
        ExposureTarget("gpu1", "2001:4860::8", 41234, EPHEMERAL))
    assert exposure_targets(host(Network.LAN, None), 41234, None, ("8.8.4.4",)) == ()


def test_on_a_public_network_every_address_is_tried_and_an_answer_warns() -> None:
    gpu1 = host(Network.PUBLIC, "198.51.100.4")
    assert exposure_targets(gpu1, 41234, None, ("8.8.4.4",)) == tuple(
        ExposureTarget("gpu1", a, 41234, EPHEMERAL, overlay=False) for a in ("10.147.17.5", "198.51.100.4", "8.8.4.4"))
    assert (is_probed(gpu1), is_probed(gpu1, controller_is_member=True)) == (True, False)
    assert (is_probed(host(Network.LAN, None)), is_probed(host(Network.WIREGUARD, None), True)) == (False, True)
    target = ExposureTarget("gpu1", "198.51.100.4", 41234, EPHEMERAL, overlay=False)
    assert exposure_findings(ExposureProbe((ExposureResult(target, "open"),))) == [warn("gpu1", (
        f"198.51.100.4:41234 ({EPHEMERAL}) answers this controller, which is not one of the hosts: with "
        "`network: public` anyone on the internet can reach torch's unauthenticated store and gloo the same way; "
        f"{FIX}"))]


def test_the_controller_knows_its_own_addresses() -> None:
    from meshrun.deploy.edges.exposure import _is_own

    assert (_is_own("127.0.0.1"), _is_own("192.0.2.55"), _is_own("gpu1.example")) == (True, False, False)


def test_a_host_cannot_make_the_controller_scan_many_addresses() -> None:
    reported = tuple(("eth0", f"8.8.8.{i}") for i in range(1, 200))
    assert public_addresses(host(Network.WIREGUARD, None), reported) == ("8.8.8.1", "8.8.8.2", "8.8.8.3", "8.8.8.4")


def test_a_busy_rendezvous_port_is_said() -> None:
    assert busy_rendezvous("gpu1", 29400) == warn("gpu1", (
        "the exposure check could not listen on the rendezvous port 29400 (in use: a run?), so it tried an "
        "ephemeral port only; run check-network again when no run holds the port"))


def test_only_an_answer_fails_a_busy_bait_or_a_failed_probe_is_said() -> None:
    target = ExposureTarget("gpu1", "203.0.113.7", 29400, "the rendezvous store's port")
    results = tuple(ExposureResult(target, s) for s in ("open", "refused", "timeout", "unreachable"))
    probe = ExposureProbe(results, (("gpu1", 29400),), (("gpu2", "host 'gpu2': the exposure probe did not start"),))
    assert exposure_findings(probe) == [
        fail("gpu1", ("203.0.113.7:29400 (the rendezvous store's port) answers off the overlay: torch's store and "
                      f"gloo are unauthenticated, whoever reaches them can join or poison the job; {FIX}")),
        busy_rendezvous("gpu1", 29400),
        warn("gpu2", "the exposure check could not run: host 'gpu2': the exposure probe did not start")]
    assert exposure_findings(ExposureProbe()) == []


def exposure_failures(inventory: Path) -> list[tuple[str, str]]:
    done = fab("check-network", "--json", "--inventory", str(inventory), "--hosts", "h1,h2", timeout=300)
    report = json.loads(done.stdout)
    return [(f["where"], f["message"]) for f in report["findings"]
            if f["level"] == "FAIL" and "answers off the overlay" in f["message"]]


PUBLIC = "192.0.0.9"  # globally routed by Python's rules (PCP anycast), never reached from a test bed


@contextmanager
def public_address_on_h2(testbed) -> Iterator[None]:
    """h2 gets a public address on its LAN interface, routed from the controller: a second way in
    that no inventory field names, which the check must find by asking the host."""
    testbed.exec(2, ["ip", "addr", "add", f"{PUBLIC}/32", "dev", "eth0"])
    subprocess.run(["ip", "route", "replace", f"{PUBLIC}/32", "via", testbed.host(2).address], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "route", "del", f"{PUBLIC}/32"], check=False)
        testbed.exec(2, ["ip", "addr", "del", f"{PUBLIC}/32", "dev", "eth0"], check=False)


@contextmanager
def firewall_up(inventory: Path) -> Iterator[None]:
    """`fab firewall up` on h1 and h2 for the block; `down` after it, whatever happens, and it must work."""
    try:
        up = fab("firewall", "up", "--inventory", str(inventory), "--hosts", "h1,h2")
        assert up.returncode == 0, up.stdout + up.stderr
        yield
    finally:
        down = fab("firewall", "down", "--inventory", str(inventory), "--hosts", "h1,h2")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.cluster
def test_store_and_ephemeral_ports_answering_off_the_overlay_fail_until_fab_firewall_up(testbed_wg,
                                                                                          wg_inventory: Path) -> None:
    with public_address_on_h2(testbed_wg):
        found = exposure_failures(wg_inventory)
        where = sorted((w, m.split(" ", 1)[0].rsplit(":", 1)[0], "29400" in m.split(" ", 1)[0]) for w, m in found)
        assert where == [("h1", "10.77.0.11", False), ("h1", "10.77.0.11", True), ("h2", "10.77.0.12", False),
                         ("h2", PUBLIC, False)], found
        assert all(m.endswith(FIX) for _, m in found)
        with firewall_up(wg_inventory):
            assert exposure_failures(wg_inventory) == []


def public_warnings(inventory: Path) -> list[tuple[str, str]]:
    done = fab("check-network", "--json", "--inventory", str(inventory), "--hosts", "h1,h2", timeout=300)
    return sorted((f["where"], f["message"].split(" ", 1)[0]) for f in json.loads(done.stdout)["findings"]
                  if f["level"] == "WARN" and "answers this controller" in f["message"])


@pytest.mark.cluster
def test_on_a_public_network_a_stranger_reaching_the_store_is_warned_until_fab_firewall_up(testbed,
                                                                                            make_inventory) -> None:
    """`network: public` has no private path: the controller (not a host) stands for the internet."""
    inventory = make_inventory(defaults_overrides={"network": "public"})
    found = public_warnings(inventory)
    assert [(w, a.rsplit(":", 1)[0]) for w, a in found] == [("h1", "10.77.0.11"), ("h1", "10.77.0.11"),
                                                             ("h2", "10.77.0.12")], found
    assert sum(a.endswith(":29400") for _, a in found) == 1
    with firewall_up(inventory):
        assert public_warnings(inventory) == []
