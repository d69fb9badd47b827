"""A detached elastic run (no controller attached) on the simulated cluster: the agents watch each
other, and a host whose link is cut is left behind without waiting out the process-group timeout."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fabrun import fab, run_id_of, run_processes
from tests.runrecords import ELASTIC_TRAIN, assert_whole_epochs, on_host

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]



def _host_records(testbed, host: int, run_id: str, name: str) -> list[dict]:
    out = testbed.exec(host, ["sh", "-c", f"cat /root/meshrun/runs/{run_id}/{name} 2>/dev/null"], check=False).stdout
    whole = out[:out.rfind("\n") + 1]  # the trainer may be writing the last line as it is read
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(1)


def test_a_detached_run_survives_a_cut_worker_without_its_controller(testbed, inventory: Path) -> None:
    """Detached: no controller probes the hosts or sends `restart`. The agents probe each other's
    sshd (deploy/host/succession.py::PeerWatcher); when h3's link is cut (no reset reaches anyone),
    h1's and h2's agents restart their workers and torchrun re-rendezvouses without h3. The
    process-group timeout is raised to 300 s, so it cannot be what frees the survivors: they must
    resume long before it (the bound below is 120 s; bench/recovery.py measures the attached path)."""
    started = fab("train", "--inventory", str(inventory), "--nnodes", "2:3", "--detach", "--timeout", "300",
                  "--", *ELASTIC_TRAIN, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_of(started.stdout)
    try:
        _wait_until(lambda: any(r.get("kind") == "step" and r.get("epoch", 0) >= 3
                                for r in _host_records(testbed, 1, run_id, "metrics.rank0.jsonl")),
                    300, "h1 training in epoch 3")
        with testbed.link_cut(3):
            cut_at = time.time()
            resumed: list[dict] = []

            def survivors_resumed() -> bool:  # rank 0 may be on h1 or h2 after the re-rendezvous
                resumed[:] = sorted((r for i in (1, 2) for r in _host_records(testbed, i, run_id, "metrics.jsonl")
                                     if r.get("kind") == "resume" and r["time"] > cut_at), key=lambda r: r["time"])
                return bool(resumed)

            def log_of(i: int) -> str:
                return testbed.exec(i, ["cat", f"/root/meshrun/runs/{run_id}/hosts/h{i}/train.log"], check=False).stdout

            try:
                _wait_until(survivors_resumed, 150, "h1 and h2 resuming without h3")
            except AssertionError as err:
                raise AssertionError(f"{err}\n--- h1 ---\n{log_of(1)[-2500:]}\n--- h2 ---\n{log_of(2)[-1500:]}") from None
            assert resumed[0]["world_size"] == 2 and resumed[0]["time"] - cut_at < 120, resumed[0]
            assert "peer(s) h3 stopped answering" in log_of(1), log_of(1)[-2000:]
            survivors = lambda: [p for p in run_processes(run_id) if on_host(p, "h1") or on_host(p, "h2")]  # noqa: E731
            _wait_until(lambda: not survivors(), 400, "the survivors finishing")
        print(f"detached: resumed {resumed[0]['time'] - cut_at:.1f} s after the cut of h3")
    finally:
        testbed.kill_processes(3)  # h3, alone, would wait out its rendezvous timeouts
        fab("stop", "--run", run_id, timeout=120)
    records = assert_whole_epochs(run_id)
    assert records[-1]["world_size"] == 2
