"""Issue 21: the control plane on 16 simulated hosts — `fab check-network` passes with every pair
probed and a 16-rank all-reduce, and a barrier-only `fab train` (pre-flight and sync included)
brings all 16 ranks past their first barrier. The timings are bench/scale.py's (P8); this proves
the behaviour at a size no other test reaches. The module borrows the session's cluster: 16 hosts
for its test, the session's 3 again afterwards."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TESTBED_HOSTS
from tests.fabrun import ROOT, fab, run_id_of
from tests.testbed import SimCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SIZE = 16


@pytest.fixture(scope="module")
def sixteen(testbed: SimCluster) -> Iterator[SimCluster]:
    testbed.up(SIZE)
    try:
        yield testbed
    finally:
        testbed.up(TESTBED_HOSTS)  # the hosts the rest of the session expects


def test_check_network_and_a_barrier_run_on_sixteen_hosts(sixteen: SimCluster, tmp_path: Path) -> None:
    inventory = str(sixteen.write_inventory(tmp_path / "hosts.yaml"))
    names = {f"h{i}" for i in range(1, SIZE + 1)}

    check = fab("check-network", "--inventory", inventory, "--json", timeout=600)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    report = json.loads(check.stdout)
    assert (report["level"], report["findings"]) == ("PASS", [])
    assert {h["name"] for h in report["hosts"] if h["reachable"]} == names
    pairs = {(l["source"], l["target"]) for l in report["links"] if not l["rendezvous"] and l["state"] == "open"}
    assert pairs == {(a, b) for a in names for b in names if a != b}  # all 240 pairs, every one open
    assert report["allreduce"]["status"] == "ok" and report["allreduce"]["world_size"] == SIZE

    train = fab("train", "--inventory", inventory, "--script", "bench/barrier_probe.py", timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert sorted(int(r) for r in re.findall(r"BARRIER rank=(\d+) ", train.stdout)) == list(range(SIZE))
    summary = json.loads((ROOT / "runs" / run_id_of(train.stdout) / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], sorted(summary["hosts"])) == ("succeeded", SIZE, sorted(names))
