"""What the `fab sync --data` tests share: a local host (its DEST a folder here, reached with the
same rsync argv a remote host gets, less ssh), a sync of SRC to it, and fresh cache and temporary
folders outside every SRC (an autouse fixture: import `homes` into the test module)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from meshrun.deploy.edges.datasync import DataResult, DataSpec, build_manifest, sync_data
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.inventory.model import Host, Network


@pytest.fixture(autouse=True)
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache folder and the temporary folder, fresh and outside every SRC."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def local_host(workdir: Path, name: str = "local") -> Host:
    workdir.mkdir(parents=True, exist_ok=True)
    return Host(name=name, address="local", ssh_address=None, user=None, port=None, identity=None, python=None,
                workdir=str(workdir), network=Network.LAN, gpus=None, nproc=1, batch_size=None, env=())


def sync(src: Path, tmp_path: Path) -> DataResult:
    """SRC to `tmp_path/wd`'s `data/ds`, verified against its manifest, within 60 s."""
    host, root = local_host(tmp_path / "wd"), tmp_path / "proj"
    return sync_data(host, LocalSession(host, root), sys.executable, DataSpec(src, "data/ds"), build_manifest(src),
                     root, None, 60)
