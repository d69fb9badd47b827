"""`fab trust` and the host-key policy end to end on the simulated cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.fabrun import ROOT, fab
from tests.testbed import SimCluster

pytestmark = pytest.mark.cluster


def known_hosts_of(inventory: Path) -> Path:
    return Path(yaml.safe_load(inventory.read_text())["known_hosts"])


def reachable(inventory: Path, host: str) -> tuple[bool, str]:
    """(reachable, error) of one host by `fab check-network --json`."""
    result = fab("check-network", "--inventory", str(inventory), "--hosts", host, "--json", timeout=180)
    facts = json.loads(result.stdout)["hosts"][0]
    return facts["reachable"], facts["error"] or ""


def test_unknown_key_is_refused_and_trust_yes_makes_it_accepted(testbed: SimCluster,
                                                                make_inventory: Callable[..., Path]) -> None:
    inventory = make_inventory(known_hosts=False)
    known = known_hosts_of(inventory)
    assert not known.exists()
    ok, error = reachable(inventory, "h1")
    fingerprint = testbed.host_key_fingerprint(1)
    assert not ok and error == (f"host 'h1': unknown SSH host key {fingerprint} (ssh-ed25519) for 10.77.0.11, not in "
                                f"~/.ssh/known_hosts or {known}; if you trust it, run: fab trust --hosts h1")

    result = fab("trust", "--inventory", str(inventory), "--hosts", "h1,h2,h3", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    for i in (1, 2, 3):
        assert testbed.host_key_fingerprint(i) in result.stdout
        assert f"trusted h{i}: 10.77.0.1{i} {testbed.host_key_fingerprint(i)} added to {known}" in result.stdout
    assert len(known.read_text().splitlines()) == 3
    assert reachable(inventory, "h1") == (True, "")

    again = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes")
    assert again.returncode == 0 and "already trusted" in again.stdout
    assert len(known.read_text().splitlines()) == 3  # nothing appended twice


def test_trust_without_yes_and_without_a_terminal_refuses(make_inventory: Callable[..., Path]) -> None:
    inventory = make_inventory(known_hosts=False)
    result = fab("trust", "--inventory", str(inventory), "--hosts", "h2")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: fab trust: 1 new host key(s) (h2) and no terminal to ask on; compare the fingerprints above with "
        "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on each host, then rerun with --yes")
    assert not known_hosts_of(inventory).exists()


def test_changed_key_is_an_error_naming_both_fingerprints_and_never_replaced(
        testbed: SimCluster, make_inventory: Callable[..., Path]) -> None:
    inventory = make_inventory()
    known = known_hosts_of(inventory)
    lines = known.read_text().splitlines()
    h2_key = lines[1].split(" ", 1)[1]
    lines[0] = f"10.77.0.11 {h2_key}"  # h1 "was" h2's key: h1 now offers a changed key
    known.write_text("\n".join(lines) + "\n")
    before = known.read_text()

    result = fab("trust", "--inventory", str(inventory), "--hosts", "h1", "--yes")
    assert result.returncode == 1
    expected = (f"error: host 'h1': SSH host key CHANGED for 10.77.0.11: known {testbed.host_key_fingerprint(2)}, "
                f"offered {testbed.host_key_fingerprint(1)}. This may be an attack; if the host was reinstalled or its "
                f"address reused, delete line 1 of {known} and run: fab trust --inventory {inventory} --hosts h1")
    assert result.stderr.strip().splitlines()[-1] == expected
    assert known.read_text() == before
    ok, error = reachable(inventory, "h1")
    # The error itself names no inventory; the console's hint repeats --inventory (deploy/render/hints.py).
    assert not ok and error == expected.removeprefix("error: ").replace(f" --inventory {inventory}", "")


def test_a_relative_known_hosts_is_the_one_beside_the_inventory_from_any_folder(
        testbed: SimCluster, make_inventory: Callable[..., Path]) -> None:
    """Issue 20, item 6: `known_hosts: pins` is the file beside the inventory, whatever the current
    directory: `trust` from one subfolder of the project writes it there, and `check-network` from
    another connects to the host it pinned (the old loader read the cwd's `pins`)."""
    inventory = make_inventory(known_hosts=False)
    doc = yaml.safe_load(inventory.read_text())
    inventory.write_text(yaml.safe_dump({**doc, "known_hosts": "pins"}))
    pins = inventory.parent / "pins"
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"}
    meshrun = [str(Path(sys.executable).parent / "meshrun")]
    trust = subprocess.run([*meshrun, "trust", "--inventory", str(inventory), "--hosts", "h1", "--yes"],
                           cwd=ROOT / "deploy", capture_output=True, text=True, timeout=180, env=env)
    assert trust.returncode == 0 and f"added to {pins}" in trust.stdout, trust.stdout + trust.stderr
    check = subprocess.run([*meshrun, "check-network", "--inventory", str(inventory), "--hosts", "h1", "--json"],
                           cwd=ROOT / "tests", capture_output=True, text=True, timeout=180, env=env)
    facts = json.loads(check.stdout)["hosts"][0]
    assert (facts["reachable"], facts["error"], len(pins.read_text().splitlines())) == (True, None, 1)
    assert not (ROOT / "deploy" / "pins").exists() and not (ROOT / "tests" / "pins").exists()
