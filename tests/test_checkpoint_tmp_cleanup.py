"""A checkpoint save killed outright leaves its temp file; the directory's next writer removes it.

fsutil's atomic writes remove their temp file in a `finally`, which a SIGKILL skips (the agent's
`restart` after a lost peer kills the workers so): each save a restart cut left a checkpoint-sized
`.tmp-ckpt-step….pt.<pid>.<hex>` on the host for the rest of the run, fetched every time (a
review). Real processes: a save really SIGKILLed mid-write, and one still writing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from meshrun.fsutil import TMP_NAME, _new_temp
from meshrun.train.checkpoint import Checkpointer, Site
from meshrun.train.config import CheckpointConfig
from meshrun.train.staletemps import stale_temps

# A save that writes part of its bytes, says so, and waits (to be killed, or to still be writing).
SAVING = """import sys, time
from pathlib import Path
from meshrun.fsutil import atomic_writer
with atomic_writer(Path(sys.argv[1])) as out:
    out.write(b"x" * 100000)
    out.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


def _saving(target: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SAVING, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def _temps_of(directory: Path, proc: subprocess.Popen[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-") and f".{proc.pid}." in p.name)


def test_only_the_trainers_temps_of_dead_writers_are_stale() -> None:
    names = [".tmp-ckpt-step000000020.pt.4242.0a1b2c3d", ".tmp-best.pt.4242.deadbeef",
             ".tmp-MANIFEST.sha256.4242.00000000", ".tmp-ckpt-step000000020.pt.77.0a1b2c3d",  # 77 lives
             ".tmp-notes.txt.4242.0a1b2c3d", ".tmp-MANIFEST.sha256.4242",  # not a trainer file; not fsutil's
             ".tmp-ckpt-step000000020.pt.4242.0A1B2C3D", ".tmp-ckpt-step20.pt.4242.0a1b2c3d",
             "ckpt-step000000020.pt", "MANIFEST.sha256", ".writer-probe-0123-0", "notes.txt"]
    assert stale_temps(names, lambda pid: pid == 77) == [
        ".tmp-MANIFEST.sha256.4242.00000000", ".tmp-best.pt.4242.deadbeef", ".tmp-ckpt-step000000020.pt.4242.0a1b2c3d"]


def test_the_pattern_reads_the_names_fsutil_gives(tmp_path: Path) -> None:
    tmp, fd = _new_temp(tmp_path / "ckpt-step000000020.pt")
    os.close(fd)
    found = TMP_NAME.fullmatch(tmp.name)
    assert found is not None and (found.group(1), int(found.group(2))) == ("ckpt-step000000020.pt", os.getpid())


def test_the_writer_removes_a_killed_saves_temp_and_nothing_else(tmp_path: Path) -> None:
    killed = _saving(tmp_path / "ckpt-step000000020.pt")
    killed.kill()
    killed.wait(30)
    left = _temps_of(tmp_path, killed)
    assert len(left) == 1  # what a kill leaves: the finally never ran
    still = _saving(tmp_path / "ckpt-step000000040.pt")
    try:
        in_flight = _temps_of(tmp_path, still)
        others = [".tmp-notes.txt.999999999.0a1b2c3d", "notes.txt", ".tmp-ckpt-step000000020.pt"]
        for name in others:
            (tmp_path / name).write_bytes(b"yours")
        before = sorted(p.name for p in tmp_path.iterdir())
        Checkpointer(tmp_path, CheckpointConfig(), Site(1, "h", False, (0,), torch.device("cpu")))
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # a rank that does not write removes nothing
        Checkpointer(tmp_path, CheckpointConfig())  # this process alone: it writes
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(in_flight + others)
    finally:
        still.kill()
        still.wait(30)
