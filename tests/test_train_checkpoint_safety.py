"""Planted checkpoints (train/safe_load.py, train/checkpoint.py): loading a checkpoint runs no
code from it, only files named like the trainer's and listed in the manifest with a matching
hash are offered, and a resume skips what does not load safely, with a warning naming host and
file. The attacker's file is real: a pickle whose ``__reduce__`` creates a marker file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from meshrun.train.checkpoint import (MANIFEST, Checkpointer, checkpoint_name, local_site, read_manifest,
                              restore_agreed)
from meshrun.train.config import CheckpointConfig
from meshrun.train.safe_load import UnsafeCheckpoint, load_file
from meshrun.fsutil import sha256_file
from tests.trainer.harness import records, train


class Planted:
    """Unpickling this calls ``open(marker, "w")``: the marker exists iff the loader ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (self.marker, "w")


def plant(path: Path, marker: Path, listed: bool) -> None:
    """Write a hostile checkpoint; ``listed``: also add it to the manifest with its true hash,
    as an attacker who can write the directory can."""
    torch.save({"format": 1, "model": Planted(marker)}, path)
    if listed:
        manifest = path.parent / MANIFEST
        entries = {**read_manifest(manifest), path.name: sha256_file(path)}
        manifest.write_text("".join(f"{h}  {n}\n" for n, h in sorted(entries.items())))


def test_the_planted_file_runs_code_unless_loaded_safely(tmp_path: Path) -> None:
    path, marker = tmp_path / checkpoint_name(7), tmp_path / "marker"
    plant(path, marker, listed=False)
    with pytest.raises(UnsafeCheckpoint, match=r"Unsupported global: GLOBAL io\.open"):
        load_file(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # what the trainer used to do: the payload runs
    assert marker.exists()


def test_only_listed_intact_trainer_files_are_offered(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    ckpt = Checkpointer(d, CheckpointConfig(keep_last=5))
    ckpt.save({"step": 1}, 1, is_best=False)
    ckpt.save({"step": 2}, 2, is_best=False)
    two = d / checkpoint_name(2)
    shutil.copy(two, d / checkpoint_name(3))  # complete, but not in the manifest
    shutil.copy(two, d / "ckpt-step4.pt")  # not the trainer's name
    shutil.copy(two, d / (checkpoint_name(4) + ".bak"))
    (d / checkpoint_name(5)).symlink_to(two)  # not a regular file
    (d / checkpoint_name(6)).write_bytes(b"damaged")
    entries = read_manifest(d / MANIFEST)
    for name in ("ckpt-step4.pt", checkpoint_name(4) + ".bak", checkpoint_name(5),
                 checkpoint_name(6)):
        entries[name] = entries[checkpoint_name(2)]  # listed, with the hash of step 2's bytes
    (d / MANIFEST).write_text("".join(f"{h}  {n}\n" for n, h in entries.items()) + "junk\n")

    warnings: list[str] = []
    found = Checkpointer(d, CheckpointConfig(keep_last=9), local_site("hostA"), warnings.append)
    assert [found.candidate(), found.candidate(frozenset({2})),
            found.candidate(frozenset({1, 2}))] == [2, 1, -1]
    assert warnings == [f"checkpoint hostA:{d / checkpoint_name(6)} does not match {MANIFEST}; "
                        "ignored",
                        f"checkpoint hostA:{d / checkpoint_name(3)} is not listed in {MANIFEST}; "
                        "ignored"]
    found.save({"step": 7}, 7, is_best=False)  # the next save's manifest: the trainer's files
    assert sorted(read_manifest(d / MANIFEST)) == [checkpoint_name(s) for s in (1, 2, 6, 7)]


def test_retention_counts_and_deletes_listed_checkpoints_only(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep_last=2))
    ckpt.save({"step": 1}, 1, is_best=False)
    ckpt.save({"step": 2}, 2, is_best=False)
    for step in (3, 4):  # unlisted: a planted file, or a save killed before the manifest
        shutil.copy(tmp_path / checkpoint_name(2), tmp_path / checkpoint_name(step))
    ckpt.save({"step": 5}, 5, is_best=False)
    assert sorted(ckpt.local_steps()) == [2, 3, 4, 5]
    assert sorted(read_manifest(tmp_path / MANIFEST)) == [checkpoint_name(2), checkpoint_name(5)]


# digits: 1438 training samples, 2 ranks x 32 = 23 steps per epoch.
COMMON = ("epochs=1", "checkpoint.every_steps=5", "log.tensorboard=false")


@pytest.mark.slow
def test_resume_skips_planted_checkpoints_on_every_rank(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    stopped = train(run, *COMMON, "debug.stop_after_step=10")
    assert stopped.returncode != 0 and "debug.stop_after_step=10" in stopped.stderr
    d = run / "checkpoints"
    plant(d / checkpoint_name(15), marker, listed=True)
    plant(d / checkpoint_name(20), marker, listed=False)

    resumed = train(run, *COMMON, env={"MESHRUN_HOST": "hostA"})
    assert resumed.returncode == 0, resumed.stderr
    assert not marker.exists()
    assert (f"checkpoint hostA:{d / checkpoint_name(20)} is not listed in {MANIFEST}; ignored"
            in resumed.stderr)
    assert (f"checkpoint hostA:{d / checkpoint_name(15)} does not load safely on ranks [0, 1] "
            "(UnpicklingError: Unsupported global: GLOBAL io.open was not an allowed global by "
            "default.); skipped, trying the next newest") in resumed.stderr
    resume = records(run, kind="resume")
    assert [(r["from_step"], r["source_rank"]) for r in resume] == [(10, 0)]
    assert records(run, kind="epoch")[-1]["global_step"] == 23


def test_restore_falls_back_past_what_does_not_load(tmp_path: Path) -> None:
    """The agreement loop in one process (world size 1: the collectives are local)."""
    d, marker = tmp_path / "checkpoints", tmp_path / "marker"
    good = {"format": 1, "model": {}, "optimizer": {}, "position": {}, "rng": [], "world_size": 1}
    Checkpointer(d, CheckpointConfig()).save(good, 1, is_best=False)
    Checkpointer(d, CheckpointConfig()).save({"format": 1}, 2, is_best=False)  # safe, not ours
    plant(d / checkpoint_name(3), marker, listed=True)
    warnings: list[str] = []
    ckpt = Checkpointer(d, CheckpointConfig(), local_site("hostA"), warnings.append)
    assert restore_agreed(ckpt, 0, torch.device("cpu")) == {**good, "restored_from_rank": 0}
    assert not marker.exists()
    assert warnings == [
        f"checkpoint hostA:{d / checkpoint_name(3)} does not load safely on ranks [0] "
        "(UnpicklingError: Unsupported global: GLOBAL io.open was not an allowed global by "
        "default.); skipped, trying the next newest",
        f"checkpoint hostA:{d / checkpoint_name(2)} does not load safely on ranks [0] (not a "
        "trainer checkpoint: no ['model', 'optimizer', 'position', 'rng', 'world_size']); "
        "skipped, trying the next newest"]
    assert restore_agreed(Checkpointer(tmp_path / "empty", CheckpointConfig()), 0,
                          torch.device("cpu")) is None
