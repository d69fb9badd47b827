"""Retention in a reused checkpoint directory: a save below steps the manifest still lists (an
earlier session's, with `checkpoint.resume: false`; or a newer copy `restore_agreed` fell back
below) must keep the file it just wrote, list it as the newest, and leave the other timeline's
files on disk unlisted. Real files, one process, no process group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshrun.fsutil import sha256_file
from meshrun.train.checkpoint import BEST, MANIFEST, Checkpointer, checkpoint_name, load_file, read_manifest
from meshrun.train.config import CheckpointConfig


def _names(*steps: int) -> list[str]:
    return [checkpoint_name(step) for step in steps]


def _earlier_session(directory: Path, keep_last: int, steps: tuple[int, ...], best: int) -> None:
    old = Checkpointer(directory, CheckpointConfig(keep_last=keep_last), warn=lambda _: None)
    for step in steps:
        old.save({"run": "old", "step": step, "w": torch.full((8,), float(step))}, step, step == best)


def _listed_and_matching(directory: Path) -> list[str]:
    listed = read_manifest(directory / MANIFEST)
    assert all(sha256_file(directory / name) == digest for name, digest in listed.items())
    return sorted(listed)


@pytest.mark.parametrize("keep_last", [1, 3])
def test_fresh_session_keeps_its_save_below_an_earlier_sessions_steps(tmp_path: Path, keep_last: int) -> None:
    """The review's case: runs/local reached step 500; a new session with resume off saves step
    100. Old code pruned the new file at once and kept listing step 500."""
    _earlier_session(tmp_path, keep_last, (300, 400, 500), best=500)
    kept = _names(300, 400, 500)[-keep_last:]
    assert _listed_and_matching(tmp_path) == sorted([BEST, *kept])
    warnings: list[str] = []
    new = Checkpointer(tmp_path, CheckpointConfig(keep_last=keep_last, resume=False), warn=warnings.append)
    assert warnings == [
        f"checkpoint.resume is false but {new.label(MANIFEST)} lists an earlier session's checkpoints "
        f"(steps {[300, 400, 500][-keep_last:] + ['best.pt']}); this run starts from step 0 and its first "
        "save supersedes them (unlisted, files left in place until a save of the same step replaces them)"]

    path = new.save({"run": "new", "step": 100}, 100, is_best=False)

    assert path == tmp_path / checkpoint_name(100) and path.exists()
    assert load_file(path) == {"run": "new", "step": 100}
    assert _listed_and_matching(tmp_path) == _names(100)  # old best.pt unlisted too: another run's
    assert Checkpointer(tmp_path, CheckpointConfig(keep_last=keep_last)).newest_valid() == 100
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == sorted(_names(100, *(int(n[9:18]) for n in kept)))
    assert load_file(tmp_path / BEST)["run"] == "old"  # left in place, not listed
    assert len(warnings) == 1  # the superseded steps were announced once, at start

    for step in (200, 300):  # the new run goes on: ordinary retention over its own saves
        new.save({"run": "new", "step": step}, step, is_best=step == 300)
    assert _listed_and_matching(tmp_path) == sorted([BEST, *_names(100, 200, 300)[-keep_last:]])
    assert load_file(tmp_path / checkpoint_name(300))["run"] == "new"
    assert load_file(tmp_path / BEST)["run"] == "new"


def test_keep_last_1_save_below_a_stale_listed_step_survives(tmp_path: Path) -> None:
    """Resume on, keep_last 1: the listed step 500 did not load everywhere, so the run started
    over; each new save must survive and be listed, not be pruned in favour of the stale 500."""
    _earlier_session(tmp_path, 1, (400, 500), best=500)
    warnings: list[str] = []
    new = Checkpointer(tmp_path, CheckpointConfig(keep_last=1), warn=warnings.append)
    assert warnings == []

    new.save({"step": 100}, 100, is_best=False)
    assert _listed_and_matching(tmp_path) == _names(100)  # best.pt was step 500's copy: unlisted
    assert warnings == [
        f"{new.label(MANIFEST)} listed steps [500, 'best.pt'] above this save (step 100), from a timeline "
        "this run did not resume; unlisted (files left in place), so resume and keep_last see this "
        "run's saves only"]
    new.save({"step": 200}, 200, is_best=False)
    assert _listed_and_matching(tmp_path) == _names(200)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == _names(200, 500)
    assert new.newest_valid() == 200
    assert warnings[1:] == [  # a later resume passes over the stale file, never offers it
        f"checkpoint {new.label(checkpoint_name(500))} is not listed in {MANIFEST}; ignored"]


def test_fallback_keeps_lower_steps_and_a_best_of_this_timeline(tmp_path: Path) -> None:
    """Resume fell back from 300 to 200: steps up to the new save keep counting (and pruning)
    as before; only the listed steps above it leave the listing, and best.pt, a copy of step 100
    (not of an abandoned step), stays listed."""
    _earlier_session(tmp_path, 3, (100, 200, 300), best=100)
    new = Checkpointer(tmp_path, CheckpointConfig(keep_last=3), warn=lambda _: None)
    new.save({"step": 250}, 250, is_best=False)
    assert _listed_and_matching(tmp_path) == sorted([BEST, *_names(100, 200, 250)])
    new.save({"step": 260}, 260, is_best=False)
    assert _listed_and_matching(tmp_path) == sorted([BEST, *_names(200, 250, 260)])
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == _names(200, 250, 260, 300)
    assert load_file(tmp_path / BEST)["step"] == 100


def test_resaving_a_listed_step_never_lists_changed_bytes(tmp_path: Path, monkeypatch) -> None:
    """A fresh session saving a step the earlier one listed replaces that file: the manifest
    must stop listing it before the bytes change (checked before and after every write)."""
    from meshrun.train import checkpoint as module
    _earlier_session(tmp_path, 3, (100, 200, 300), best=300)
    write, moments = module.atomic_write_bytes, []

    def checked_write(path: Path, data: bytes) -> str:
        moments.append(_listed_and_matching(tmp_path))
        digest = write(path, data)
        moments.append(_listed_and_matching(tmp_path))
        return digest

    monkeypatch.setattr(module, "atomic_write_bytes", checked_write)
    new = Checkpointer(tmp_path, CheckpointConfig(keep_last=3, resume=False), warn=lambda _: None)
    new.save({"run": "new", "step": 100}, 100, is_best=False)
    assert moments[-1] == _names(100)
    assert load_file(tmp_path / checkpoint_name(100))["run"] == "new"
