"""Checkpoint files: a kill during a write leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from meshrun.train.checkpoint import MANIFEST, Checkpointer, checkpoint_name, load_file, read_manifest
from meshrun.train.config import CheckpointConfig
from meshrun.fsutil import TMP_PREFIX, sha256_file
from tests.trainer.harness import REPO, clean_env

# Saves step 1, then starts step 2 with a writer that stops for good after its first chunk:
# the kill lands with part of the new checkpoint on disk.
WRITER = """
import sys, time, torch
from pathlib import Path
from meshrun import fsutil
from meshrun.train.checkpoint import Checkpointer
from meshrun.train.config import CheckpointConfig

ckpt = Checkpointer(Path(sys.argv[1]), CheckpointConfig(keep_last=1))
ckpt.save({"w": torch.arange(10.0)}, 1, is_best=True)
write = fsutil.HashingWriter.write

def stalling_write(self, data):
    n = write(self, data)
    self.flush()
    Path(sys.argv[2]).write_text("partial")
    time.sleep(600)
    return n

fsutil.HashingWriter.write = stalling_write
ckpt.save({"w": torch.randn(200_000)}, 2, is_best=True)
"""


def test_kill_during_write_leaves_previous_checkpoint(tmp_path: Path) -> None:
    directory, flag = tmp_path / "checkpoints", tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(flag)],
                            cwd=REPO, env=clean_env())
    try:
        deadline = time.monotonic() + 120
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "the writer never reached the middle of the second save"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    partial = [p for p in directory.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert partial and partial[0].stat().st_size > 0  # we really killed it mid-write
    assert not (directory / checkpoint_name(2)).exists()
    ckpt = Checkpointer(directory, CheckpointConfig(keep_last=1))
    assert ckpt.newest_valid() == 1
    assert torch.equal(load_file(directory / checkpoint_name(1))["w"], torch.arange(10.0))
    manifest = read_manifest(directory / MANIFEST)
    assert sorted(manifest) == ["best.pt", checkpoint_name(1)]
    assert all(sha256_file(directory / n) == h for n, h in manifest.items())


def test_the_manifest_lists_only_matching_files_at_every_moment_of_a_save(tmp_path: Path, monkeypatch) -> None:
    """A host killed between any two of a save's file operations (or a fetch that reads the
    manifest and then the files) must never find a listed file whose bytes differ or that is gone:
    CI saw `best.pt` replaced and the host killed before the manifest followed. The check runs
    before and after every file the save writes, so it sees each state a kill could leave."""
    from meshrun.train import checkpoint as module
    write, moments = module.atomic_write_bytes, []

    def consistent() -> None:
        listed = read_manifest(tmp_path / MANIFEST) if (tmp_path / MANIFEST).exists() else {}
        wrong = [n for n, h in listed.items() if not (tmp_path / n).exists() or sha256_file(tmp_path / n) != h]
        assert not wrong, f"moment {len(moments)}: listed but changed or gone: {wrong}"
        moments.append(sorted(listed))

    def checked_write(path: Path, data: bytes) -> str:
        consistent()
        digest = write(path, data)
        consistent()
        return digest

    monkeypatch.setattr(module, "atomic_write_bytes", checked_write)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep_last=2))
    for step in range(1, 7):
        ckpt.save({"step": step, "w": torch.full((100,), float(step))}, step, is_best=step % 2 == 1)
    consistent()
    assert moments[-1] == ["best.pt", checkpoint_name(5), checkpoint_name(6)]
    assert load_file(tmp_path / "best.pt")["step"] == 5
    assert len(moments) > 20  # every write of the six saves was seen


def test_retention_keeps_last_k_and_best(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep_last=2))
    for step in range(1, 6):
        ckpt.save({"step": step}, step, is_best=step == 2)
    assert sorted(ckpt.local_steps()) == [4, 5]
    assert load_file(tmp_path / "best.pt")["step"] == 2
    assert sorted(read_manifest(tmp_path / MANIFEST)) == ["best.pt", checkpoint_name(4),
                                                         checkpoint_name(5)]


def test_corrupted_newest_is_skipped(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep_last=3))
    ckpt.save({"step": 1}, 1, is_best=False)
    ckpt.save({"step": 2}, 2, is_best=False)
    (tmp_path / checkpoint_name(2)).write_bytes(b"garbage")  # e.g. a bad rsync
    assert Checkpointer(tmp_path, CheckpointConfig()).newest_valid() == 1
