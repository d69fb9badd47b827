"""A fresh start (nothing restored) in a used run dir: its records stand alone, and it is no restart.

Before the fix a second bare ``python -m meshrun.train`` with ``checkpoint.resume=false`` (or after
the checkpoints were deleted) appended its epoch records to the first run's ``metrics.jsonl`` and
``tensorboard/``, so deploy/run/report.py (``fab report``, report.png; it keeps each epoch's record
written last) mixed two unrelated runs: epochs 1 and 2 of the new run, epoch 3 of the old. And
outside torchrun train/starts.py keyed every invocation by the rendezvous id "", so the fresh run's
result.json said ``restarts: 1`` (then 2, 3, ...). Now the earlier run's files are renamed
``<name>.earlier-<UTC time>`` (train/metrics.py ``set_aside``), never deleted, and a bare start is
counted as its own launch's first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from meshrun.deploy.run.report import load_report
from meshrun.layout import STARTS_FILE
from meshrun.train.metrics import earlier_name, set_aside
from meshrun.train.starts import count_start
from tests.trainer.harness import records, train

NOON = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def test_an_earlier_runs_files_are_renamed_never_deleted_and_empty_ones_stay(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"kind": "epoch"}\n')
    (tmp_path / "metrics.rank0.jsonl").write_text("")  # this start's own, just opened: nothing to move
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out").write_text("x")
    (tmp_path / "metrics.jsonl.earlier-20270115-080000").write_text("an even earlier run\n")
    moved = set_aside(tmp_path, ["metrics.jsonl", "metrics.rank0.jsonl", "tensorboard", "absent"], NOON)
    assert moved == [("metrics.jsonl", "metrics.jsonl.earlier-20270115-080000-2"),
                     ("tensorboard", "tensorboard.earlier-20270115-080000")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl.earlier-20270115-080000", "metrics.jsonl.earlier-20270115-080000-2",
        "metrics.rank0.jsonl", "tensorboard.earlier-20270115-080000"]
    assert (tmp_path / "metrics.jsonl.earlier-20270115-080000-2").read_text() == '{"kind": "epoch"}\n'
    assert earlier_name("metrics.rank1.jsonl", "s", ()) == "metrics.rank1.jsonl.earlier-s"  # no *.jsonl


def test_a_start_outside_torchrun_is_its_own_launchs_first(tmp_path: Path) -> None:
    """Rendezvous id "" (no torchrun): every invocation is start 1, and nothing shared is recorded."""
    cpu = torch.device("cpu")
    assert [count_start(tmp_path, "", True, cpu) for _ in range(3)] == [1, 1, 1]  # before: 1, 2, 3
    assert not (tmp_path / STARTS_FILE).exists()
    assert [count_start(tmp_path, "r1", True, cpu) for _ in range(2)] == [1, 2]  # under torchrun: counted
    assert json.loads((tmp_path / STARTS_FILE).read_text()) == {"r1": 2}


@pytest.mark.slow
def test_a_fresh_run_in_a_used_run_dir_reports_only_itself(tmp_path: Path) -> None:
    """Two bare runs in one --run-dir: 3 epochs, then 2 epochs at another LR with resume=false."""
    run = tmp_path / "run"
    first = train(run, "epochs=3", nproc=0)
    assert first.returncode == 0, first.stderr
    old = records(run, kind="epoch")
    second = train(run, "epochs=2", "optim.lr=0.001", "checkpoint.resume=false", nproc=0)
    assert second.returncode == 0, second.stderr

    new = records(run, kind="epoch")
    assert [r["epoch"] for r in new] == [1, 2] and new[0]["test_acc"] != old[0]["test_acc"]
    report = load_report(run)
    assert [(p.epoch, p.test_acc, p.time) for p in report.epochs] == \
        [(r["epoch"], r["test_acc"], r["time"]) for r in new]  # before: epoch 3 of the first run too
    assert report.resumes == 0
    result = json.loads((run / "result.json").read_text())
    assert (result["epochs_completed"], result["restarts"]) == (2, 0)  # before: restarts 1

    names = sorted(os.listdir(run))
    aside = [n for n in names if ".earlier-" in n]
    assert [n.split(".earlier-")[0] for n in aside] == ["metrics.jsonl", "metrics.rank0.jsonl", "tensorboard"]
    assert records(run, aside[0], kind="epoch") == old  # the first run's, whole
    assert any((run / "tensorboard").iterdir()) and STARTS_FILE not in names
    assert f"fresh start: metrics.jsonl of an earlier run in {run} moved to {aside[0]}" in second.stdout


@pytest.mark.slow
def test_a_restart_of_the_same_launch_before_its_first_checkpoint_keeps_its_records(tmp_path: Path) -> None:
    """torch restarts a launch's workers with the same TORCHELASTIC_RUN_ID: a restart before the first
    checkpoint restores nothing, yet it is this launch's second start, not another run. Its records stay
    where they are (the review of this stop's commits found them set aside as "an earlier run's").
    Stood in by two bare runs of one launch id, the second restoring nothing (checkpoint.resume=false)."""
    run = tmp_path / "run"
    launch = {"TORCHELASTIC_RUN_ID": "launch-a"}
    assert train(run, "epochs=1", nproc=0, env=launch).returncode == 0
    again = train(run, "epochs=1", "checkpoint.resume=false", nproc=0, env=launch)
    assert again.returncode == 0, again.stderr
    assert not [n for n in os.listdir(run) if ".earlier-" in n] and "fresh start" not in again.stdout
    assert [r["epoch"] for r in records(run, kind="epoch")] == [1, 1]  # both starts' records, in one file
    assert json.loads((run / STARTS_FILE).read_text()) == {"launch-a": 2}
