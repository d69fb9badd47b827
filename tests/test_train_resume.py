"""Killed and resumed training under torchrun with 2 gloo processes."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.train.checkpoint import MANIFEST, read_manifest
from meshrun.fsutil import sha256_file
from tests.trainer.harness import records, train


def test_resume_after_epoch_2_continues_at_epoch_3(tmp_path: Path) -> None:
    """The stop comes right after epoch 2's checkpoint is written, the moment a restart cost the run
    its epoch record when the record came after the save (a CI run of tests/test_elastic.py lost
    epoch 6 so): the record must be there, and the resume must not redo the epoch."""
    run = tmp_path / "run"
    first = train(run, "epochs=4", "debug.stop_after_epoch=2", "log.tensorboard=false", torchrun=True)
    assert first.returncode != 0, first.stderr
    assert [r["epoch"] for r in records(run, kind="epoch")] == [1, 2]
    assert not (run / "result.json").exists()

    second = train(run, "epochs=4", "log.tensorboard=false", torchrun=True)
    assert second.returncode == 0, second.stderr
    resume = records(run, kind="resume")
    assert len(resume) == 1 and resume[0]["epoch"] == 2 and resume[0]["world_size"] == 2
    epochs = records(run, kind="epoch")
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    assert resume[0]["from_step"] == epochs[1]["global_step"]
    assert epochs[3]["global_step"] == 2 * epochs[1]["global_step"]
    result = json.loads((run / "result.json").read_text())
    assert result["epochs_completed"] == 4 and result["world_size"] == 2
    assert result["global_step"] == epochs[3]["global_step"]
    ckpts = run / "checkpoints"
    manifest = read_manifest(ckpts / MANIFEST)
    assert "best.pt" in manifest and len(manifest) == 4  # keep_last=3 + best
    assert all(sha256_file(ckpts / name) == digest for name, digest in manifest.items())
    progress = json.loads((run / "progress.json").read_text())
    assert progress["epoch"] == 4 and progress["world_size"] == 2
