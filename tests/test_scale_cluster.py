"""Issue 21: the control plane on 16 simulated hosts — `fab check-network` passes with every pair
probed and a 16-rank all-reduce, and a barrier-only `fab train` (pre-flight and sync included)
brings all 16 ranks past their first barrier. The timings are bench/scale.py's (P8); this proves
the behaviour at a size no other test reaches. And the test bed itself at 32 hosts: every pair
connects, and the machine's neighbour limits are back as they were afterwards. The module borrows
the session's cluster; the session's 3 hosts come back after each test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TESTBED_HOSTS, hosts_up
from tests.fabrun import ROOT, fab, run_id_of
from tests.testbed import SimCluster
from tests.testbed.network import NEIGH_SYSCTLS

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.alone_cluster]

SIZE = 16


@pytest.fixture(scope="module")
def sixteen(testbed: SimCluster) -> Iterator[SimCluster]:
    with hosts_up(testbed, SIZE) as cluster:
        yield cluster


def test_check_network_and_a_barrier_run_on_sixteen_hosts(sixteen: SimCluster, tmp_path: Path) -> None:
    inventory = str(sixteen.write_inventory(tmp_path / "hosts.yaml"))
    names = {f"h{i}" for i in range(1, SIZE + 1)}

    check = fab("check-network", "--inventory", inventory, "--json", timeout=600)
    report = json.loads(check.stdout) if check.stdout.startswith("{") else {}
    assert (check.returncode, report.get("level"), report.get("findings")) == (0, "PASS", []), (
        report.get("allreduce"), check.stderr[-3000:] or check.stdout[-3000:])
    assert {h["name"] for h in report["hosts"] if h["reachable"]} == names
    pairs = {(l["source"], l["target"]) for l in report["links"] if not l["rendezvous"] and l["state"] == "open"}
    assert pairs == {(a, b) for a in names for b in names if a != b}  # all 240 pairs, every one open
    assert report["links_rule"] == "every pair"  # up to 32 hosts (deploy/check/linkplan.py)
    assert report["allreduce"]["status"] == "ok" and report["allreduce"]["world_size"] == SIZE
    assert len({h["machine"] for h in report["hosts"]}) == 1  # one kernel: the probe's budget counts 16 on its CPUs

    train = fab("train", "--inventory", inventory, "--script", "bench/barrier_probe.py", timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert sorted(int(r) for r in re.findall(r"BARRIER rank=(\d+) ", train.stdout)) == list(range(SIZE))
    summary = json.loads((ROOT / "runs" / run_id_of(train.stdout) / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], sorted(summary["hosts"])) == ("succeeded", SIZE, sorted(names))
    assert summary["trained_alone"] == []  # every rank joined (deploy/run/alone.py)


CONNECT_ALL = """
import socket, sys
from concurrent.futures import ThreadPoolExecutor
def one(address):
    try:
        socket.create_connection((address, int(sys.argv[1])), timeout=5).close()
        return None
    except OSError as err:
        return f"{address}: {err}"
with ThreadPoolExecutor(64) as pool:
    print([e for e in pool.map(one, sys.argv[2:]) if e])
"""


def test_thirty_two_hosts_every_pair_connects_and_down_restores_the_machine(testbed: SimCluster) -> None:
    """32 hosts, each connecting to every other's sshd at once (992 pairs): all answer. The
    kernel's one neighbour table for every namespace held 1024 entries by default, so the last
    pairs lost their packets (check-network: "timeout" from h23..h32 to h29..h31, 2026-12-01);
    up() raises the limits for the size it brings up and down() puts the machine's back."""
    testbed.up(TESTBED_HOSTS)  # the module's 16 hosts (and the limits they raised) may still be up
    limits = {path: Path(path).read_text() for path in NEIGH_SYSCTLS if Path(path).exists()}
    try:
        testbed.up(32)
        addresses = [h.address for h in testbed.hosts]
        procs = [testbed.popen(h.index, [sys.executable, "-c", CONNECT_ALL, str(testbed.ssh_port),
                                         *[a for a in addresses if a != h.address]],
                               stdout=subprocess.PIPE, text=True) for h in testbed.hosts]
        failed = {f"h{i}": out for i, out in enumerate((p.communicate(timeout=120)[0].strip() for p in procs), 1)
                  if out != "[]"}
        assert failed == {}
    finally:
        testbed.up(TESTBED_HOSTS)
    assert {path: Path(path).read_text() for path in limits} == limits
