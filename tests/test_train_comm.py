"""DDP comm hooks (train/comm.py): PowerSGD state in checkpoints, exact resume, reset on a new
world size; config validation. Forked ranks (tests/trainer/forkrun.py), gloo on CPU, 2 ranks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from meshrun.train.checkpoint import checkpoint_name, load_file
from meshrun.train.config import CommHook, load_config
from meshrun.train.errors import UsageError
from tests.trainer.harness import records, train

# digits: 1438 training samples, 2 ranks x 32 = 23 steps per epoch; step 30 is mid-epoch 2.
POWERSGD = ("epochs=2", "checkpoint.every_steps=5", "log.tensorboard=false", "comm.hook=powersgd",
            "comm.powersgd_rank=2", "comm.start_iter=4")
FINAL_STEP = 46


def test_config_rejects_start_iter_of_one_and_unknown_hooks() -> None:
    with pytest.raises(UsageError, match=r"'comm.start_iter' must be > 1 .*start_powerSGD_iter"):
        load_config(None, ("comm.start_iter=1",))
    with pytest.raises(UsageError, match=r"'comm.hook' must be one of none, fp16, bf16, powersgd, "
                                         r"localsgd, diloco, diloco-overlap, hier; got 'powersdg' "
                                         r"\(did you mean 'powersgd'\?\)"):
        load_config(None, ("comm.hook=powersdg",))
    assert load_config(None, ("comm.hook=bf16",)).comm.hook is CommHook.BF16


@pytest.mark.slow
def test_powersgd_resumes_with_its_state_exactly_and_resets_it_on_a_new_world_size(
        tmp_path: Path) -> None:
    """One run stopped at step 30, resumed from two copies of it: on the same 2 processes (exact,
    with the saved state) and on 3 (state reset). A copy, not a second stopped run: seeds are
    fixed, so a second run with the same arguments writes the same checkpoints."""
    straight, broken, wider = tmp_path / "straight", tmp_path / "broken", tmp_path / "wider"
    assert train(straight, *POWERSGD).returncode == 0
    stopped = train(broken, *POWERSGD, "debug.stop_after_step=30")
    assert stopped.returncode != 0 and "debug.stop_after_step=30" in stopped.stderr
    shutil.copytree(broken, wider)
    check_powersgd_resumes_with_its_state_exactly(straight, broken)
    check_new_world_size_resets_the_hook_state(wider)


def check_powersgd_resumes_with_its_state_exactly(straight: Path, broken: Path) -> None:
    saved = load_file(broken / "checkpoints" / checkpoint_name(30))["comm"]
    assert (saved["hook"], saved["world_size"], len(saved["ranks"])) == ("powersgd", 2, 2)
    ranks = [r["powersgd"] for r in saved["ranks"]]
    assert all(r["iter"] == 30 and r["matrix_approximation_rank"] == 2 for r in ranks)
    # Error feedback is per rank (that is why every rank's state is gathered); P/Q memories are not.
    assert not torch.equal(ranks[0]["error_dict"][0], ranks[1]["error_dict"][0])
    assert torch.equal(ranks[0]["q_memory_dict"][0], ranks[1]["q_memory_dict"][0])

    resumed = train(broken, *POWERSGD)
    assert resumed.returncode == 0, resumed.stderr
    assert "comm: powersgd hook state restored from the checkpoint" in resumed.stdout
    a = load_file(straight / "checkpoints" / checkpoint_name(FINAL_STEP))["model"]
    b = load_file(broken / "checkpoints" / checkpoint_name(FINAL_STEP))["model"]
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def check_new_world_size_resets_the_hook_state(run: Path) -> None:
    resumed = train(run, *POWERSGD, nproc=3)
    assert resumed.returncode == 0, resumed.stderr
    assert ("comm: world size changed (2 -> 3): powersgd hook state reset (per-rank error "
            "feedback and warm-up start over)") in resumed.stdout
    assert records(run, kind="epoch")[-1]["world_size"] == 3
    comm = load_file(run / "checkpoints" / "best.pt")["comm"]
    assert comm["world_size"] == 3 and len(comm["ranks"]) == 3
