"""`fab train` on the bundled local inventory: real torchrun, real gloo processes, real files."""

from __future__ import annotations

import json
import signal

import pytest

from tests.cpuhog import cpu_hog
from tests.fabrun import ROOT, FabProcess, fab, run_id_of, run_processes, wait_no_run_processes

pytestmark = pytest.mark.slow


def test_fab_train_local_default_reaches_95_percent_and_writes_summary() -> None:
    done = fab("train", timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = run_id_of(done.stdout)
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["status"] == "succeeded"
    assert summary["hosts"] == ["local"] and summary["world_size"] == 2 and summary["restarts"] == 0
    assert summary["epochs_completed"] >= 1 and summary["metrics"]["test_acc"] >= 0.95
    assert summary["duration_s"] > 0
    assert "[local:0] " in done.stdout  # rank-prefixed live logs
    log = (ROOT / "runs" / run_id / "logs" / "local.log").read_text()
    assert "[local:0] " in log and "epoch" in log
    assert not run_processes(run_id)

    # fab report on the same run: a table, JSON, and a real PNG with curves in it.
    shown = fab("report", "--run", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "local" in shown.stdout and "samples/s" in shown.stdout
    data = json.loads(fab("report", "--run", run_id, "--json").stdout)
    assert data["final_test_acc"] == pytest.approx(summary["metrics"]["test_acc"])
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["total_samples_per_s"] > 0
    png = ROOT / "runs" / run_id / "report.png"
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 900
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


@pytest.mark.parametrize("sig,limit", [(signal.SIGINT, 15.0), (signal.SIGKILL, 30.0)])
def test_interrupted_or_killed_controller_leaves_no_process(sig: int, limit: float) -> None:
    """Ctrl-C stops the run everywhere; a SIGKILLed controller's agent notices EOF and stops it."""
    fab_run = FabProcess("train", "--", "epochs=500")
    try:
        run_id = run_id_of(fab_run.wait_for(r"\[local:0\] epoch 1 ", timeout=120))
        assert run_processes(run_id)
        with cpu_hog():  # the bound must hold on a loaded machine
            if sig == signal.SIGINT:
                fab_run.signal_group(sig)  # what a terminal's Ctrl-C does
            else:
                fab_run.proc.kill()  # only the controller: its agent must notice
            wait_no_run_processes(run_id, timeout=limit)
        if sig == signal.SIGINT:
            assert fab_run.finish(timeout=60) == 1, fab_run.output[-2000:]
            summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
            assert summary["status"] == "stopped"
            assert "every host is clean" in fab_run.output
    finally:
        fab_run.close()
