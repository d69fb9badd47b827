"""Mid-epoch kill and resume: same final weights as an uninterrupted run; reshard on resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from meshrun.train.checkpoint import checkpoint_name, load_file
from tests.trainer.harness import records, train

# digits: 1438 training samples, 2 ranks x 32 = 23 steps per epoch; step 30 is mid-epoch 2.
COMMON = ("epochs=2", "checkpoint.every_steps=5", "log.tensorboard=false")
FINAL_STEP = 46


def final_model(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / checkpoint_name(FINAL_STEP))["model"]


@pytest.mark.slow
def test_mid_epoch_resume_is_exact_and_fewer_processes_use_each_sample_once(tmp_path: Path) -> None:
    """One run stopped at step 30, resumed from two copies of it: on the same 2 processes (exact)
    and on one. A copy, not a second stopped run: seeds are fixed, so a second run with the same
    arguments writes the same checkpoints, and each stopped run costs a launch."""
    straight, broken, fewer = tmp_path / "straight", tmp_path / "broken", tmp_path / "fewer"
    assert train(straight, *COMMON).returncode == 0
    stopped = train(broken, *COMMON, "debug.stop_after_step=30")
    assert stopped.returncode != 0 and "debug.stop_after_step=30" in stopped.stderr
    shutil.copytree(broken, fewer)
    check_mid_epoch_resume_matches_uninterrupted_run(straight, broken)
    check_resume_on_fewer_processes_uses_each_sample_once(fewer)


def check_mid_epoch_resume_matches_uninterrupted_run(straight: Path, broken: Path) -> None:
    resumed = train(broken, *COMMON)
    assert resumed.returncode == 0, resumed.stderr

    resume = records(broken, kind="resume")[0]
    assert resume["from_step"] == 30 and resume["epoch"] == 1
    assert resume["consumed_in_epoch"] == 7 * 64  # 7 steps into epoch 2
    a, b = final_model(straight), final_model(broken)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    ea, eb = records(straight, kind="epoch"), records(broken, kind="epoch")
    assert [r["epoch"] for r in eb] == [1, 2]
    assert eb[1]["samples_seen"] == ea[1]["samples_seen"] == 2 * 1438
    assert abs(eb[1]["train_loss"] - ea[1]["train_loss"]) <= 1e-6


def check_resume_on_fewer_processes_uses_each_sample_once(run: Path) -> None:
    resumed = train(run, *COMMON, nproc=0)  # plain process: world size 1, no process group
    assert resumed.returncode == 0, resumed.stderr
    resume = records(run, kind="resume")[0]
    assert (resume["world_size"], resume["saved_world_size"]) == (1, 2)
    last = records(run, kind="epoch")[-1]
    # 1438 - 448 = 990 samples left in epoch 2, at 32 per step on one process: 31 steps.
    assert last["samples_seen"] == 2 * 1438 and last["global_step"] == 30 + 31
    assert last["world_size"] == 1
