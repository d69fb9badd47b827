"""The exposure check (issue 12, hole 6a): on an overlay inventory, check-network connects from the
controller (not on the overlay) to each host's `ssh_address` on the rendezvous port and on an
ephemeral port where a bait listens on every address, as torch's stores and gloo do; an answer
FAILs, naming the host, address, port and the fix. Pure verdicts by exact equality, then the real
thing on the simulated cluster over wireguard-go, before and after `fab firewall up`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshrun.deploy.check.exposure import (FIX, ExposureResult, ExposureTarget, exposure_findings, exposure_targets)
from meshrun.deploy.check.findings import fail
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


def test_only_an_answer_fails() -> None:
    target = ExposureTarget("gpu1", "203.0.113.7", 29400, "the rendezvous store's port")
    results = tuple(ExposureResult(target, s) for s in ("open", "refused", "timeout", "unreachable"))
    assert exposure_findings(results) == [fail("gpu1", (
        "203.0.113.7:29400 (the rendezvous store's port) answers off the overlay: torch's store and gloo are "
        f"unauthenticated, whoever reaches them can join or poison the job; {FIX}"))]


def exposure_failures(inventory: Path) -> list[tuple[str, str]]:
    done = fab("check-network", "--json", "--inventory", str(inventory), "--hosts", "h1,h2", timeout=300)
    report = json.loads(done.stdout)
    return [(f["where"], f["message"]) for f in report["findings"]
            if f["level"] == "FAIL" and "answers off the overlay" in f["message"]]


@pytest.mark.cluster
def test_store_and_ephemeral_ports_answering_off_the_overlay_fail_until_fab_firewall_up(testbed_wg,
                                                                                          wg_inventory: Path) -> None:
    found = exposure_failures(wg_inventory)
    where = sorted((w, m.split(" ", 1)[0].rsplit(":", 1)[0], "29400" in m.split(" ", 1)[0]) for w, m in found)
    assert where == [("h1", "10.77.0.11", False), ("h1", "10.77.0.11", True), ("h2", "10.77.0.12", False)], found
    assert all(m.endswith(FIX) for _, m in found)
    try:
        up = fab("firewall", "up", "--inventory", str(wg_inventory), "--hosts", "h1,h2")
        assert up.returncode == 0, up.stdout + up.stderr
        assert exposure_failures(wg_inventory) == []
    finally:
        down = fab("firewall", "down", "--inventory", str(wg_inventory), "--hosts", "h1,h2")
    assert down.returncode == 0, down.stdout + down.stderr
