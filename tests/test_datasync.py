"""`fab sync --data`: a dataset reaches each simulated host, unchanged data is not sent again,
and a corrupt copy with the right size and mtime (which rsync's quick check would miss) is found
by the sha256 manifest and repaired."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.fabrun import fab

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]


def test_data_sync_skips_unchanged_and_repairs_corruption(testbed, inventory: Path, tmp_path: Path) -> None:
    data = tmp_path / "digits-data"
    (data / "sub").mkdir(parents=True)
    for name, size in (("a.bin", 200_000), ("b.bin", 3), ("sub/c.bin", 70_000)):
        (data / name).write_bytes(os.urandom(size))
    flag = f"{data}:data/digits"
    first = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "h2: data data/digits: 3 files verified by sha256; 3 sent" in first.stdout
    remote = "/root/meshrun/data/digits/sub/c.bin"
    assert testbed.exec(1, ["sha256sum", remote]).stdout.split()[0] == \
        hashlib.sha256((data / "sub/c.bin").read_bytes()).hexdigest()

    again = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert "h1: data data/digits: 3 files verified by sha256; unchanged, nothing sent" in again.stdout

    # Flip bytes on h2 but keep size and mtime: only the manifest can tell.
    testbed.exec(2, ["python3", "-c", f"import os; s = os.stat('{remote}'); f = open('{remote}', 'r+b'); "
                     f"f.write(b'XXXX'); f.close(); os.utime('{remote}', ns=(s.st_atime_ns, s.st_mtime_ns))"])
    repaired = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "h2: corrupt copies found and sent again: sub/c.bin" in repaired.stderr
    assert testbed.exec(2, ["sha256sum", remote]).stdout.split()[0] == \
        hashlib.sha256((data / "sub/c.bin").read_bytes()).hexdigest()


def test_bad_data_flag_is_one_line(tmp_path: Path) -> None:
    done = fab("sync", "--data", f"{tmp_path}/missing:data")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --data: {tmp_path}/missing is not a directory; point SRC at the local dataset directory"
