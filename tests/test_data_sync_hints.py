"""`fab sync --data`'s failure lines say what to do: a sync cut at its deadline keeps what arrived
and the same command resumes it; a host whose disk filled is named as full, not sent to check the
network. The pure choice of hint by exact equality; real rsync to a local host's workdir for a cut
transfer and (where a tmpfs can be mounted here) for a full disk."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.edges import datasync
from meshrun.deploy.edges.datasync import DataSpec, build_manifest, sync_data
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.dataplan import rehinted
from tests.datalocal import homes, local_host  # noqa: F401 (homes: the autouse fixture)

NET = "; check `fab check-network --hosts gpu1`"
RESUME = ("; what arrived is kept at data/ds: run the same `fab sync --data /home/a/ds:data/ds` again to resume it, "
          "with --timeout SECONDS for longer (if it stays slow: `fab check-network --hosts gpu1`)")
FULL = ("; the disk holding data/ds on gpu1 is full: free space there, then run the same "
        "`fab sync --data /home/a/ds:data/ds` again (what arrived is kept)")
NO_SPACE = 'rsync: [receiver] write failed on "/w/data/ds/b.bin": No space left on device (28)'


def hint(message: str, source: str = "/home/a/ds") -> str:
    return rehinted(message, "gpu1", source, "data/ds")


def test_a_cut_sync_says_it_resumes() -> None:
    cut = "host 'gpu1': data sync did not finish within 900 s; rsync was stopped (rsync error: received SIGINT)"
    assert hint(cut + NET) == cut + RESUME


@pytest.mark.parametrize("rc", [11, 12, 23])
def test_a_full_disk_names_the_host_and_dest(rc: int) -> None:
    failed = f"host 'gpu1': data sync failed (rsync exit {rc}): {NO_SPACE} | rsync error: error in file IO"
    assert hint(failed + NET) == failed + FULL


@pytest.mark.parametrize("message", [
    "host 'gpu1': data sync failed (rsync exit 23): rsync: [sender] send_files failed: Permission denied" + NET,
    "host 'gpu1': data sync failed (rsync exit 30: no data from the host for 60 s): " + NO_SPACE + NET,
    # The host's own words cannot choose the hint: the exit status is the one meshrun wrote first.
    "host 'gpu1': data sync failed (rsync exit 5): x (rsync exit 11): " + NO_SPACE + NET,
    "host 'gpu1': data sync failed (rsync exit 11): --mkpath unknown; the host's rsync is older than 3.2.3: "
    "install a newer one there",
    "host 'gpu1': data sync: cannot run rsync here (No such file or directory); install rsync"])
def test_other_failures_keep_their_line(message: str) -> None:
    assert hint(message) == message


def test_the_command_to_rerun_is_quoted_and_one_line() -> None:
    cut = "host 'gpu1': data sync did not finish within 9 s; rsync was stopped (no message)"
    assert hint(cut + NET, "/data/my set\n") == cut + (
        "; what arrived is kept at data/ds: run the same `fab sync --data '/data/my set\\n:data/ds'` again to "
        "resume it, with --timeout SECONDS for longer (if it stays slow: `fab check-network --hosts gpu1`)")





def run_sync(src: Path, workdir: Path, tmp_path: Path, timeout: float = 60):
    host, root = local_host(workdir, "gpu1"), tmp_path / "proj"
    return sync_data(host, LocalSession(host, root), sys.executable, DataSpec(src, "data/ds"), build_manifest(src),
                     root, None, timeout)


def test_real_rsync_cut_at_the_deadline_says_rerun_and_the_rerun_completes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(2 << 20)
    (src / "big.bin").write_bytes(big)
    # 2 MiB at 50 KiB/s cannot arrive within the one second the transfer is given: it is always cut.
    monkeypatch.setattr(datasync, "io_timeout_option", lambda: "--bwlimit=50k")
    real_left = datasync._left
    monkeypatch.setattr(datasync, "_left", lambda deadline: min(real_left(deadline), 1.0))
    with pytest.raises(MeshrunError) as err:
        run_sync(src, tmp_path / "wd", tmp_path)
    message = str(err.value)
    assert message.startswith("host 'gpu1': data sync did not finish within 1 s; rsync was stopped ("), message
    assert message.endswith(f"; what arrived is kept at data/ds: run the same `fab sync --data {src}:data/ds` again "
                            "to resume it, with --timeout SECONDS for longer (if it stays slow: `fab check-network --hosts gpu1`)"), message
    assert "\n" not in message
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert run_sync(src, tmp_path / "wd", tmp_path).repaired == ()
    assert (tmp_path / "wd" / "data" / "ds" / "big.bin").read_bytes() == big


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs as the host's workdir; skipped where this user cannot mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_real_rsync_to_a_full_disk_names_the_host(tmp_path: Path, small_disk: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (src / "b.bin").write_bytes(os.urandom(2 << 20))
    with pytest.raises(MeshrunError) as err:
        run_sync(src, small_disk, tmp_path)
    message = str(err.value)
    assert message.startswith("host 'gpu1': data sync failed (rsync exit ") and "No space left on device" in message
    assert message.endswith(f"; the disk holding data/ds on gpu1 is full: free space there, then run the same "
                            f"`fab sync --data {src}:data/ds` again (what arrived is kept)"), message
    assert "check-network" not in message and "\n" not in message
