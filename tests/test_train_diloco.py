"""DiLoCo in the trainer (forked ranks, tests/trainer/forkrun.py; gloo on CPU): replicas drift within a round and agree
after it, checkpoints carry the round, resume at a round's end and mid-round is exact, an elastic
restart at a new world size finishes the interrupted round, and the config names the hooks. The
digits accuracy of both variants against `none` is in tests/test_train_end_to_end.py, beside the
`none` run it compares with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from meshrun.train.checkpoint import checkpoint_name
from meshrun.train.config import CommHook, load_config
from meshrun.train.errors import UsageError
from tests.trainer.harness import REPO, clean_env, records, train

# digits: 1438 training samples, 2 ranks x 32 = 23 steps per epoch. With H = 4 the rounds of
# epoch 2 end at steps 27, 31, ...; step 30 is 3 inner steps into a round. The paper's outer
# Nesterov step (not digits.yaml's plain averaging), so the outer optimizer has state to resume.
RUN = ("epochs=2", "checkpoint.every_steps=5", "log.tensorboard=false",
       "comm.diloco_inner_steps=4", "comm.diloco_outer_lr=0.7", "comm.diloco_outer_momentum=0.9")
FINAL_STEP = 46


def load(path: Path) -> dict:
    """Checkpoints must load without unpickling code (plain tensors, dicts, lists, ints)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def test_config_takes_the_diloco_keys_and_rejects_bad_values() -> None:
    cfg = load_config(None, ("comm.hook=diloco-overlap", "comm.diloco_inner_steps=16",
                             "comm.diloco_nesterov=false")).comm
    assert (cfg.hook, cfg.diloco_inner_steps, cfg.diloco_nesterov) == \
        (CommHook.DILOCO_OVERLAP, 16, False)
    with pytest.raises(UsageError, match=r"'comm.diloco_outer_momentum' must be in \[0, 1\); got 1.0"):
        load_config(None, ("comm.diloco_outer_momentum=1",))
    with pytest.raises(UsageError, match=r"'comm.diloco_inner_steps' must be >= 1; got 0"):
        load_config(None, ("comm.diloco_inner_steps=0",))


def test_describe_names_the_hook_and_its_round_length() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "meshrun.train", "--describe", "comm.hook=diloco",
                           "comm.diloco_inner_steps=12"], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    comm = json.loads(done.stdout.splitlines()[-1])["comm"]
    assert comm["hook"] == "diloco" and comm["diloco_inner_steps"] == 12


@pytest.mark.slow
def test_diloco_resumes_exactly_at_and_within_a_round_and_a_new_world_size_finishes_it(
        tmp_path: Path) -> None:
    """The run stopped mid-round at step 30 is copied before it is resumed: the original resumes on
    2 processes (exact), the copy on 3 (the round is finished from the saved replicas)."""
    straight, broken = stop_at_a_round_end_then_mid_round(tmp_path, "diloco")
    wider = tmp_path / "wider"
    shutil.copytree(broken, wider)
    check_resume_mid_round_matches_uninterrupted_run(straight, broken, "diloco")
    check_new_world_size_finishes_the_interrupted_round(wider)


@pytest.mark.slow
def test_diloco_overlap_resumes_exactly_at_and_within_a_round(tmp_path: Path) -> None:
    straight, broken = stop_at_a_round_end_then_mid_round(tmp_path, "diloco-overlap")
    check_resume_mid_round_matches_uninterrupted_run(straight, broken, "diloco-overlap")


def stop_at_a_round_end_then_mid_round(tmp_path: Path, hook: str) -> tuple[Path, Path]:
    """An uninterrupted run, and one chain that stops at step 20 (a round's end), resumes and
    stops at step 30 (mid-round): both resume points in one run, so the final comparison
    (check_resume_mid_round_matches_uninterrupted_run) covers both; a resume that is itself
    resumed comes with it. Returns (uninterrupted, stopped at step 30)."""
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    done = train(straight, *RUN, f"comm.hook={hook}")
    assert done.returncode == 0, done.stderr[-3000:]
    # The flush before each evaluation is timed apart, as a part of the evaluation's time.
    assert all(0 < r["sync_seconds"] <= r["eval_seconds"] for r in records(straight, kind="epoch"))

    edge = train(broken, *RUN, f"comm.hook={hook}", "debug.stop_after_step=20")
    assert edge.returncode != 0 and "debug.stop_after_step=20" in edge.stderr
    # Step 20 ends a round mid-epoch: no replica saved either (the overlap's round is pending).
    boundary = load(broken / "checkpoints" / checkpoint_name(20))["comm"]
    assert boundary["diloco"]["inner_step"] == 0 and [r["params"] for r in boundary["ranks"]] == [None, None]
    assert (boundary["diloco"]["pending"] is not None) == (hook == "diloco-overlap")

    # Resumed from the round's end (replicas rebuilt from the anchor), stopped mid-round.
    stopped = train(broken, *RUN, f"comm.hook={hook}", "debug.stop_after_step=30")
    assert stopped.returncode != 0 and "debug.stop_after_step=30" in stopped.stderr
    assert f"comm: {hook} hook state restored from the checkpoint" in stopped.stdout
    mid = load(broken / "checkpoints" / checkpoint_name(30))["comm"]
    assert (mid["hook"], mid["world_size"], mid["diloco"]["inner_step"]) == (hook, 2, 3)
    # No gradient all-reduce inside a round: the two replicas differ three steps in.
    assert max_diff(mid["ranks"][0]["params"], mid["ranks"][1]["params"]) > 1e-4
    assert [r["samples"] for r in mid["ranks"]] == [96, 96]
    assert (mid["diloco"]["pending"] is not None) == (hook == "diloco-overlap")
    # The epoch end flushed the round: both replicas are the outer model, the one evaluated,
    # saved once (the anchor), not once per rank.
    end = load(broken / "checkpoints" / checkpoint_name(23))
    ranks = end["comm"]["ranks"]
    assert end["comm"]["diloco"]["inner_step"] == 0 and end["comm"]["diloco"]["pending"] is None
    assert [r["params"] for r in ranks] == [None, None]
    assert max_diff(end["comm"]["diloco"]["anchor"], list(end["model"].values())) == 0.0
    return straight, broken


def check_resume_mid_round_matches_uninterrupted_run(straight: Path, broken: Path, hook: str) -> None:
    resumed = train(broken, *RUN, f"comm.hook={hook}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"comm: {hook} hook state restored from the checkpoint" in resumed.stdout
    a = load(straight / "checkpoints" / checkpoint_name(FINAL_STEP))
    b = load(broken / "checkpoints" / checkpoint_name(FINAL_STEP))
    assert max(((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])) == 0.0
    assert records(straight, kind="epoch")[-1]["test_acc"] == records(broken, kind="epoch")[-1]["test_acc"]


def check_new_world_size_finishes_the_interrupted_round(run: Path) -> None:
    saved = load(run / "checkpoints" / checkpoint_name(30))["comm"]
    resumed = train(run, *RUN, "comm.hook=diloco", nproc=3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ("comm: world size changed (2 -> 3): diloco outer state restored; the interrupted "
            "round was completed from the 2 saved replicas and a new round starts from the "
            "outer model") in resumed.stdout
    assert saved["diloco"]["inner_step"] == 3
    last = records(run, kind="epoch")[-1]
    assert last["world_size"] == 3
    comm = load(run / "checkpoints" / checkpoint_name(last["global_step"]))["comm"]
    assert comm["world_size"] == 3 and len(comm["ranks"]) == 3
    assert [r["params"] for r in comm["ranks"]] == [None] * 3  # flushed: every replica is the anchor
