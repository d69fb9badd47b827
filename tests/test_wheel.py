"""The wheel `fab setup` pushes (deploy/edges/wheel.py): a valid PEP 427 wheel of exactly the
files the controller's build digest covers, with the installed metadata (dependencies, the
`meshrun` command). Installing it is proven on simulated hosts (test_setup, test_user_project)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

from meshrun.deploy.edges.wheel import controller_identity, controller_wheel
from meshrun.deploy.host.facts import meshrun_folders, package_files


def test_the_wheel_holds_the_build_it_is_named_for(tmp_path: Path) -> None:
    mine = controller_identity()
    wheel = controller_wheel(tmp_path)
    assert wheel == tmp_path / mine.build / f"meshrun-{mine.version}-py3-none-any.whl"
    info = f"meshrun-{mine.version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = dict(package_files(meshrun_folders() or {}))
        assert names - {n for n in names if n.startswith(info + "/")} == set(shipped)
        assert {"meshrun/deploy/host/agent.py", "meshrun/train/configs/digits.yaml", "meshrun/layout.py"} <= names
        for name, path in shipped.items():
            assert z.read(name) == Path(path).read_bytes(), name
        meta = z.read(f"{info}/METADATA").decode()
        assert f"\nName: meshrun\nVersion: {mine.version}\n" in meta and "Requires-Dist: torch" in meta
        assert "meshrun = meshrun.deploy.program:main" in z.read(f"{info}/entry_points.txt").decode()
        assert "Root-Is-Purelib: true\nTag: py3-none-any\n" in z.read(f"{info}/WHEEL").decode()
        rows = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
        assert {r[0] for r in rows} == names and rows[-1] == [f"{info}/RECORD", "", ""]
        for name, digest, size in rows[:-1]:
            data = z.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data)), name


def test_a_second_call_reuses_the_cached_wheel(tmp_path: Path) -> None:
    first = controller_wheel(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert controller_wheel(tmp_path) == first and first.stat().st_mtime_ns == stamp
