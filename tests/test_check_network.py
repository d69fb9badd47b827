"""`fab check-network` end to end on the simulated 3-host cluster, driven as a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from meshrun.deploy.check.sites import pair_stats
from meshrun.deploy.edges.wheel import controller_identity
from tests.conftest import _testbed_unavailable, hosts_up
from tests.fabrun import REPO, ROOT, fab, run_id_of
from tests.testbed import SimCluster
from tests.testbed import wireguard as testbed_wireguard
from tests.testbed.layout import Host

pytestmark = pytest.mark.cluster
# The tests that name no fixed address run on any slot's cluster (tests/conftest.py).
EITHER = pytest.mark.either_cluster
RDZV_PORT = 29400


def check(inventory: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = fab("check-network", "--inventory", str(inventory), *args, timeout=timeout)
    return result, time.monotonic() - start


def check_json(inventory: Path, *args: str) -> tuple[dict[str, Any], int, float]:
    result, elapsed = check(inventory, "--json", *args)
    try:
        return json.loads(result.stdout), result.returncode, elapsed
    except ValueError:
        raise AssertionError(f"no JSON from check-network:\n{result.stdout}\n{result.stderr}") from None


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["hosts"]}


def failing(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["where"], f["message"]) for f in report["findings"] if f["level"] == "FAIL"]


@contextmanager
def iptables(testbed: SimCluster, i: int, rule: list[str]) -> Iterator[None]:
    """An INPUT rule in host i's network namespace, removed even on failure."""
    if shutil.which("iptables") is None:
        _testbed_unavailable("iptables not installed (apt-get install iptables; tests/run does)")
    netns = ["ip", "netns", "exec", testbed.host(i).netns, "iptables"]
    subprocess.run([*netns, "-I", "INPUT", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run([*netns, "-D", "INPUT", *rule], check=True)


@EITHER
@pytest.mark.slow
def test_all_checks_pass_with_table_and_json(inventory: Path) -> None:
    result, elapsed = check(inventory)
    print(result.stdout, result.stderr, sep="\n")
    assert result.returncode == 0, result.stdout + result.stderr
    for i in (1, 2, 3):
        assert f"h{i} ({Host(i).address}, lan): PASS" in result.stdout
    assert "reachable, host key verified" in result.stdout and "rdzv h1:29400" in result.stdout
    assert "check-network PASS: 3 host(s), 6 link(s) probed (every pair), 0 failure(s), 0 warning(s)" in result.stdout

    report, code, _ = check_json(inventory)
    assert (code, report["level"], report["findings"]) == (0, "PASS", [])
    for host in report["hosts"]:
        assert host["reachable"] and host["fingerprint"]["torch"] == torch.__version__
        assert host["fingerprint"]["meshrun"] == str(controller_identity())  # no version skew
        assert (host["interface"], host["mtu"], host["gpus"]) == ("eth0", 1500, [])
    pairs = {(l["source"], l["target"]) for l in report["links"] if not l["rendezvous"]}
    assert pairs == {(a, b) for a in ("h1", "h2", "h3") for b in ("h1", "h2", "h3") if a != b}
    assert all(l["state"] == "open" for l in report["links"]) and len(report["links"]) == 9
    assert all(l["df_ok"] is True and l["df_size"] == 1472 for l in report["links"] if not l["rendezvous"])
    assert report["rendezvous"] == {"host": "h1", "address": Host(1).address, "port": RDZV_PORT, "listener": "listening"}
    assert report["allreduce"]["status"] == "ok" and report["allreduce"]["world_size"] == 3
    print(f"check-network on 3 hosts: {elapsed:.1f} s wall (fab), {report['duration_s']} s measured inside")


def test_cut_host_is_fail_within_the_connect_timeout(testbed: SimCluster, inventory: Path) -> None:
    with testbed.link_cut(2):
        report, code, elapsed = check_json(inventory, "--timeout", "3")
    hosts = by_name(report)
    assert code == 1 and report["level"] == "FAIL"
    assert not hosts["h2"]["reachable"] and hosts["h1"]["reachable"] and hosts["h3"]["reachable"]
    assert ("h2", hosts["h2"]["error"]) in failing(report)
    assert "within 3 s" in hosts["h2"]["error"]
    assert report["allreduce"]["status"] == "skipped"
    assert {(l["source"], l["target"]) for l in report["links"] if not l["rendezvous"]} == {("h1", "h3"), ("h3", "h1")}
    print(f"check-network with h2 cut: {elapsed:.1f} s wall, {report['duration_s']} s inside")
    assert report["duration_s"] < 3 + 20  # the dead host costs its connect timeout, not minutes


def test_closed_rendezvous_port_is_detected(testbed: SimCluster, inventory: Path) -> None:
    """A firewall on the rendezvous host rejects its port; everything else stays open."""
    rule = ["-p", "tcp", "--dport", str(RDZV_PORT), "-j", "REJECT", "--reject-with", "tcp-reset"]
    with iptables(testbed, 1, rule):
        report, code, _ = check_json(inventory)
    assert code == 1
    rdzv = [l for l in report["links"] if l["rendezvous"]]
    assert {(l["source"], l["state"]) for l in rdzv} == {("h1", "refused"), ("h2", "refused"), ("h3", "refused")}
    assert all(l["state"] == "open" for l in report["links"] if not l["rendezvous"])
    assert ("h2 -> h1", "rendezvous port 10.77.0.11:29400 on h1 is refused (connection refused): torchrun cannot "
                        "rendezvous; allow TCP 29400 to h1 from every host (docs/public-ip.md#ports)") in failing(report)


def test_rendezvous_port_taken_by_another_process_is_detected(testbed: SimCluster, inventory: Path) -> None:
    squatter = testbed.popen(1, [sys.executable, "-c", (
        "import socket, time; s = socket.create_server(('0.0.0.0', %d)); print('up', flush=True); time.sleep(120)"
        % RDZV_PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "up"
        report, code, _ = check_json(inventory)
    finally:
        squatter.kill()
        squatter.wait()
    assert code == 1 and report["rendezvous"]["listener"] == "in use (Address already in use)"
    assert ("h1", "rendezvous port 29400 cannot be opened on h1: in use (Address already in use); another process "
                  "holds it (a run in progress?): stop it or change `rendezvous.port`") in failing(report)


@EITHER
@pytest.mark.slow
def test_a_member_planting_a_pickle_in_the_check_store_runs_nothing_anywhere(testbed: SimCluster, inventory: Path,
                                                                             tmp_path: Path) -> None:
    """Issue 20: h3 plays a compromised member during the check's all-reduce: it writes into h1's
    store a pickle that would create a file, under the check's rendezvous key and the next
    generations' (tests/rdzv_attacker.py). Nothing runs anywhere; the all-reduce FAILs naming h1
    when the plant comes before the round completes."""
    marks = tmp_path / "planted"
    marks.mkdir()
    store = f"{testbed.host(1).address}:{RDZV_PORT}"
    go = tmp_path / "go"
    go.touch()  # at once: the check's round is short
    attacker = testbed.popen(3, [sys.executable, str(REPO / "tests" / "rdzv_attacker.py"), str(marks), "h3", "200",
                                 str(go), store], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        report, code, _ = check_json(inventory)
        planted = json.loads(attacker.communicate(timeout=120)[0].splitlines()[-1])
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert sorted(p.name for p in marks.iterdir()) == []  # on the old code: ran-h1-<pid>, ran-h2-..., ran-h3-...
    assert planted["landed"][store] >= 1, planted
    # When the plant reaches h1's store before the probe's short round completes, the check FAILs
    # naming h1. Under load the honest round can complete first (a CI run, 2026-12-02) and the
    # probe ends before anyone reads the state again: the check passes. Either way nothing ran
    # (above); a run's live store is read again and refused every time (test_rdzv_store_hostile.py).
    outcome = (code, report["allreduce"]["status"])
    assert outcome in {(1, "failed"), (0, "ok")}, report["allreduce"]
    if outcome[0] == 1:
        assert (f"meshrun: the rendezvous store on host 'h1' ({store}) holds a rendezvous state that no torchrun of "
                "this run wrote (not JSON): refused; a member of the run may be compromised") in report["allreduce"]["detail"]


def test_blocked_ephemeral_ports_are_detected(testbed: SimCluster, inventory: Path) -> None:
    """Only SSH and the rendezvous port open on h3: gloo/NCCL's all-to-all would fail."""
    rule = ["-p", "tcp", "-m", "conntrack", "--ctstate", "NEW", "-m", "multiport", "!", "--dports",
            f"22,{RDZV_PORT}", "-j", "DROP"]
    with iptables(testbed, 3, rule):
        report, code, _ = check_json(inventory)
    assert code == 1
    closed = {(l["source"], l["target"], l["state"]) for l in report["links"] if l["state"] != "open"}
    assert closed == {("h1", "h3", "timeout"), ("h2", "h3", "timeout")}


def test_python_without_torch_is_fail(make_inventory: Callable[..., Path]) -> None:
    inventory = make_inventory(host_overrides={"h3": {"python": "/usr/bin/python3"}})
    report, code, _ = check_json(inventory)
    h3 = by_name(report)["h3"]
    assert code == 1 and h3["fingerprint"]["torch"] is None
    assert ("h3", f"torch is not importable by the host's python {h3['fingerprint']['python']} "
                  "(ModuleNotFoundError: No module named 'torch'); install torch there or point `python:` in the "
                  "inventory at a venv that has it") in failing(report)
    assert report["allreduce"]["status"] == "skipped"


@contextmanager
def wg_state_visible_to_ssh(testbed: SimCluster) -> Iterator[None]:
    """Let SSH sessions on each host read the real wireguard-go's state with `wg show`.

    On a real host `wg` finds wireguard-go's control socket in /var/run/wireguard. The test bed
    runs each wireguard-go in a private mount namespace (three wg0 sockets would collide), so here
    each host's sshd namespace gets its own /var/run/wireguard with a link to its own daemon's
    socket. The state read through it is the live daemon's: nothing is simulated.
    """
    uapi = testbed_wireguard.UAPI_DIR
    for h in testbed.hosts:
        pid = testbed_wireguard.pid_of(h, testbed.paths)
        assert pid is not None, f"no wireguard-go on {h.name}"
        testbed.exec(h.index, ["mount", "-t", "tmpfs", "meshrun-test-wg", uapi])
        # /var/run is a symlink to /run: spelled out, or it would resolve in our own namespace.
        daemon_socket = f"/proc/{pid}/root{os.path.realpath(uapi)}/wg0.sock"
        testbed.exec(h.index, ["ln", "-s", daemon_socket, f"{uapi}/wg0.sock"])
    try:
        yield
    finally:
        for h in testbed.hosts:
            testbed.exec(h.index, ["umount", uapi], check=False)


@pytest.mark.slow
def test_wireguard_overlay_is_the_training_interface(testbed_wg: SimCluster, wg_inventory: Path) -> None:
    # Without the firewall the store and gloo ports answer on the bridge: the exposure check FAILs
    # (tests/test_exposure.py). A clean PASS needs them closed off the overlay.
    firewall = ("--inventory", str(wg_inventory))
    assert fab("firewall", "up", *firewall).returncode == 0
    try:
        with wg_state_visible_to_ssh(testbed_wg):
            report, code, _ = check_json(wg_inventory)
    finally:
        assert fab("firewall", "down", *firewall).returncode == 0
    assert (code, report["level"]) == (0, "PASS"), report["findings"]
    for host in report["hosts"]:
        assert (host["network"], host["interface"], host["mtu"]) == ("wireguard", "wg0", 1420)
        assert host["address"].startswith("10.78.0.") and len(host["wireguard"]["peers"]) == 2
        assert host["wireguard"]["error"] is None
    assert all(l["df_size"] == 1392 and l["df_ok"] for l in report["links"] if not l["rendezvous"])
    assert report["allreduce"]["status"] == "ok"


@pytest.mark.slow
def test_bandwidth_is_measured_on_every_link_in_bounded_time(testbed: SimCluster, inventory: Path) -> None:
    with testbed.shaped("50mbit"):
        report, code, elapsed = check_json(inventory, "--bandwidth")
    assert code == 0, report["findings"]
    rates = [l["mbit_s"] for l in report["links"] if not l["rendezvous"]]
    # Every link measured, none above the shaper. Links of one host are probed while the other hosts
    # probe theirs (they share its port), so a single figure may read well below 50.
    assert len(rates) == 6 and all(r is not None and 1 < r < 80 for r in rates), rates
    assert max(rates) > 20, rates
    print(f"check-network --bandwidth at 50mbit: {rates} Mbit/s, {elapsed:.1f} s")


@EITHER
@pytest.mark.slow
def test_bandwidth_on_two_sites_warns_of_the_places_the_inventory_does_not_declare(
        testbed: SimCluster, make_inventory: Callable[..., Path]) -> None:
    """Issue 22: on the `two-site` profile (h1, h2 | h3, 20 Mbit/s and 40 ms between) the measured
    matrix falls into two places; with only h1's `site: office` declared, check-network WARNs with
    the lines that would declare them (with them it says nothing of places: tests/test_check_sites.py)
    and sums the matrix up by the sites it has (h2 and h3 places of their own). `fab train --comm
    auto`, which measures the same matrix, says it too, with what hier would do once they are declared."""
    undeclared = make_inventory(host_overrides={"h1": {"site": "office"}})
    # The project crosses to the hosts on the LAN, not over the shaped link (the test's phases
    # print with -s: 44 s alone, 124 s in CI beside the other worker, cause not yet known).
    synced = fab("sync", "--inventory", str(undeclared))
    assert synced.returncode == 0, synced.stdout[-2000:] + synced.stderr[-2000:]
    started = time.monotonic()
    with testbed.profile("two-site"):
        report, code, elapsed = check_json(undeclared, "--bandwidth")
        checked = time.monotonic()
        trained = fab("train", "--inventory", str(undeclared), "--skip-checks", "--no-sync", "--comm", "auto",
                      "--", "epochs=1", "log.tensorboard=false", timeout=600)  # 300 s ran out in a CI run beside
        # the 16-host test (2026-12-05)
    timings = f"check-network {checked - started:.1f} s, train {time.monotonic() - checked:.1f} s"
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-2000:]
    hint = re.search(r"comm: (the measured links fall into 2 places \(h1, h2 \| h3; .*? write: h1: \{site: office\}; "
                     r"h2: \{site: office\}; h3: \{site: site-2\} \(docs/sites.md\); with them declared, --comm auto "
                     r"would choose hier [\d.]+ ms \([\d.]+ ms inside \+ [\d.]+ ms between\) per step \(this run's .*\))$",
                     trained.stdout + trained.stderr, re.M)
    assert hint, trained.stdout[-3000:]
    plan = json.loads((ROOT / "runs" / run_id_of(trained.stdout) / "commplan.json").read_text())
    assert plan["places_hint"] == hint.group(1) and plan["site_links"]["sites"] == [
        ["office", ["h1"]], ["host:h2", ["h2"]], ["host:h3", ["h3"]]]
    assert code == 0, report["findings"]
    between = {frozenset(("h1", "h3")), frozenset(("h2", "h3"))}
    for link in report["links"]:
        if not link["rendezvous"]:
            slow = frozenset((link["source"], link["target"])) in between
            assert (link["mbit_s"] < 25 and link["connect_ms"] > 30) if slow else link["mbit_s"] > 200, link
    places = [f for f in report["findings"] if f["where"] == "cluster"]
    assert [f["level"] for f in places] == ["WARN"], report["findings"]
    assert places[0]["message"].startswith("the measured links fall into 2 places (h1, h2 | h3; ")
    assert places[0]["message"].endswith(
        "write: h1: {site: office}; h2: {site: office}; h3: {site: site-2} (docs/sites.md)")
    by_site = {(p["a"], p["b"]): p for p in report["places"]}
    assert list(by_site) == [("office", "host:h2"), ("office", "host:h3"), ("host:h2", "host:h3")], by_site
    for pair, place in by_site.items():
        slow = "host:h3" in pair
        assert place["pairs"] == 1 and ((place["mbit_s"] < 25 and place["rtt_ms"] > 30) if slow
                                        else place["mbit_s"] > 200), place
    print(f"two-site: {timings}; fab train said: {hint.group(0)}")


@pytest.fixture
def five(testbed: SimCluster) -> Iterator[SimCluster]:
    with hosts_up(testbed, 5) as cluster:
        yield cluster


def measured_nested(five: SimCluster, inventory: Path) -> tuple[dict, dict, dict]:
    """check-network --bandwidth on the `nested` profile: its report, and per pair ("12") the best
    bandwidth and smallest RTT as the clustering takes them, and the best bandwidth alone."""
    with five.profile("nested"):
        report, _, _ = check_json(inventory, "--bandwidth")
    # What the test claims is the places, from the links; not the end-to-end all-reduce, which a
    # CI run with the 16-host test beside it starved past its budget (2026-12-05; other tests own it).
    assert [link for link in report["links"] if link["state"] != "open"] == [], report["findings"]
    stats = {"".join(sorted(h[1] for h in pair)): v for pair, v in pair_stats(
        (k["source"], k["target"], k["mbit_s"], k["connect_ms"]) for k in report["links"] if not k["rendezvous"]).items()}
    return report, stats, {pair: mbit for pair, (mbit, _) in stats.items()}


@EITHER
def test_bandwidth_cuts_nested_places_where_bandwidth_and_rtt_agree(five: SimCluster, tmp_path: Path) -> None:
    """Issue 22, places that nest, on real links: the `nested` profile puts h1, h2 | h3, h4 | h5 in
    three places 20 Mbit/s and 40 ms apart, the first place's LAN shaped to 200 Mbit/s (Wi-Fi) beside the
    second's unshaped veth. The widest bandwidth gap is then between the two LANs, and a cut there
    (check-network before 2026-12-05) split h1 from h2. h3 and h4 declare `site: dc`: the WARN's
    lines keep it and declare the rest, and the matrix by site has dc inside."""
    inventory = five.write_inventory(tmp_path / "hosts.yaml", host_overrides={h: {"site": "dc"} for h in ("h3", "h4")})
    # The premise is the machine's, not meshrun's: the widest gap between consecutive bandwidths is the
    # one between the two LANs. The unshaped veth's figure is what the probe's CPU reaches: beside the
    # suite it once read 1747 Mbit/s against the Wi-Fi LAN's 190 (2026-12-07), short of the 10x the gap
    # needs. One more measurement then; a premise that fails twice fails the test.
    for _ in range(2):
        report, stats, best = measured_nested(five, inventory)
        slow = {pair: mbit for pair, mbit in best.items() if pair not in ("12", "34")}
        assert 200 * 0.85 < best["12"] < 200 * 1.05 and max(slow.values()) < 25, best
        if best["34"] / best["12"] > best["12"] / max(slow.values()):
            break
    assert best["34"] / best["12"] > best["12"] / max(slow.values()), best
    print(f"nested: best Mbit/s per pair {best}; smallest RTT ms per pair { {p: r for p, (_, r) in stats.items()} }")
    places = [f["message"] for f in report["findings"] if f["where"] == "cluster"]
    assert len(places) == 1 and places[0].startswith("the measured links fall into 3 places (h1, h2 | h3, h4 | h5; ")
    assert places[0].endswith("write: h1: {site: site-1}; h2: {site: site-1}; h3: {site: dc}; h4: {site: dc}; "
                              "h5: {site: site-3} (docs/sites.md)"), places
    by_site = {(p["a"], p["b"]): p for p in report["places"]}
    assert by_site[("dc", "dc")]["mbit_s"] == best["34"] and by_site[("host:h1", "host:h2")]["mbit_s"] == best["12"]
    assert by_site[("host:h1", "dc")]["pairs"] == 2 and by_site[("host:h1", "dc")]["rtt_ms"] > 30


def test_a_command_to_a_cut_host_fails_instead_of_hanging(testbed: SimCluster, inventory: Path) -> None:
    """An open session whose link is then cut (no reset ever comes): a command must fail with a
    MeshrunError naming the host, within the connect timeout plus the command's. Fabric opens the
    channel with paramiko's default wait of an hour; `fab train` hung there after a run that lost
    its rendezvous host by a cut (bench/recovery.py)."""
    from meshrun.deploy.edges.transport import connect
    from meshrun.deploy.errors import MeshrunError
    from meshrun.deploy.inventory.load import load_inventory

    inv = load_inventory(inventory)
    h2 = next(h for h in inv.hosts if h.name == "h2")
    session = connect(h2, inv.known_hosts, REPO, timeout=3)
    outcome: list[object] = []
    try:
        assert session.run(["true"], timeout=5, create_workdir=True).ok
        with testbed.link_cut(2):
            def ask() -> None:
                try:
                    outcome.append(session.run(["true"], timeout=5))
                except MeshrunError as err:
                    outcome.append(err)
            asker = threading.Thread(target=ask, daemon=True)
            started = time.monotonic()
            asker.start()
            asker.join(60)
            elapsed = time.monotonic() - started
    finally:
        session.close()
    assert outcome, "the command to the cut host was still waiting after 60 s"
    assert isinstance(outcome[0], MeshrunError) and "h2" in str(outcome[0]), outcome
    print(f"command to a cut host failed after {elapsed:.1f} s: {outcome[0]}")
