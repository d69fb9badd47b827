"""summary.json's `restarts` of a --script run on the test bed: a real torchrun restart after a host is
lost, counted by the runner on the surviving host (deploy/host/runscript.py's starts.json) and read
back by the controller after the run (deploy/commands/trainend.py). The pure rules are in
tests/test_script_restarts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fabrun import FabProcess, run_id_of, wait_no_run_processes
from tests.runrecords import summary_of

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]


def test_a_script_run_that_lost_a_host_counts_its_restart(testbed, inventory: Path) -> None:
    """h1 and h2 hold in a group of two (a gloo barrier loop); h2 is killed outright, h1's barrier fails,
    and torchrun on h1 starts the group again with h1 alone, whose script ends at once. The run
    succeeds with restarts 1 (it was always 0 for scripts), and h1's own record of the launch says two
    starts."""
    run = FabProcess("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--nnodes", "1:2", "--skip-checks",
                     "--script", "tests/scripts/hold_while_two.py", "--", "600")
    try:
        output = run.wait_for(r"\[h1:\d+\] HOLD start world=2", timeout=240)
        run.wait_for(r"\[h2:\d+\] HOLD start world=2", timeout=60)
        run_id = run_id_of(output)
        assert testbed.kill_processes(2)
        run.wait_for(r"\[h1:\d+\] HOLD start world=1", timeout=180)
        assert run.finish(timeout=120) == 0, run.output[-4000:]
    finally:
        run.close()
    summary = summary_of(run_id)
    assert (summary["status"], summary["lost_hosts"], summary["restarts"]) == ("succeeded", ["h2"], 1), summary
    recorded = testbed.exec(1, ["cat", f"/root/meshrun/runs/{run_id}/starts.json"]).stdout
    assert list(json.loads(recorded).values()) == [2], recorded
    wait_no_run_processes(run_id, timeout=30)
