"""`fab train` never changes the code another run runs from, over real sshd and real rsync.

Its code sync runs beside the connect and the pre-flight; a second train on hosts where a run runs
failed later (the first run's port, say) after the sync had replaced that run's code, so the run's
next worker restart, succession or resume imported new code beside the old. The remote code sync now
runs the host-side busy test in the rsync's own command (deploy/run/syncbusy.py `busy_guard`).

The running run is stood in for by what the test reads: a process holding h2's agent lock for a run,
as an agent does for its whole life (no torch is started for it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fabrun import ROOT, fab

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]

RUN = "20261207-120000-beef"
LOCK = f"/root/meshrun/runs/{RUN}/hosts/h2/agent.lock"
NEW = "meshrun_test_new_model.py"  # a file the hosts do not have: the project's code changed


def test_fab_train_sends_nothing_to_a_host_a_run_runs_from(testbed, inventory: Path) -> None:
    testbed.exec(2, ["mkdir", "-p", str(Path(LOCK).parent)])
    # flock(1) holds the lock while its command runs; the command ends when its stdin closes.
    holder = testbed.popen(2, ["timeout", "300", "flock", LOCK, "sh", "-c", "echo held; read _ || :"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    (ROOT / NEW).write_text("WIDTH = 1024\n")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--skip-checks", timeout=180)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.splitlines()[-1] == (
            f"error: a run this controller has no record of on that host is running from its workdir (h2 says {RUN}): "
            "the code sync would change the code it runs from (a worker restart or a --resume would import the new "
            "code beside the old; nothing was synced to that host); stop it where it was started, or wait; or start "
            "this run beside it on the code those hosts hold: --no-sync")
        assert "world size" not in done.stdout  # no run started (renderer.run_started)
        assert testbed.exec(2, ["test", "-e", f"/root/meshrun/{NEW}"], check=False).returncode == 1  # not a byte
        assert holder.poll() is None  # the run's agent, as it was
    finally:
        (ROOT / NEW).unlink()
        holder.communicate(timeout=30)  # its stdin closed: the lock let go
        for host in (1, 2):
            testbed.exec(host, ["rm", "-f", f"/root/meshrun/{NEW}"])
    assert holder.returncode == 0
