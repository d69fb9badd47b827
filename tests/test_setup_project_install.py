"""`fab setup` installs the project itself when it is a package (deploy/run/requirements.py).

A researcher's `pip install -e .` at home makes `import mypkg` work from `scripts/train.py` and in
a `src/` layout; a host's venv without it failed at the first import of the first run. The host side
now runs `pip install --no-deps -e .` in the workdir, again only when the build files change.

The host script runs as the controller ships it (`python -c`, from `setup_argv`) in a workdir on this
machine, with a real venv (reusing this interpreter's packages, as `--reuse-site` does) and a real
pip that builds the project with setuptools from the package index; the meshrun wheel step is
skipped by a stamp that already names the request's build (tests/test_setup.py installs one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from meshrun.deploy.commands import setup
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.host import setup as host_setup
from meshrun.deploy.run.requirements import Requirements, project_requirements

BASE = getattr(sys, "_base_executable", sys.executable)
BUILD = "0123456789ab"
PYPROJECT = ('[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "mypkg"\nversion = "0.1"\n')


def run_setup(workdir: Path, requirements: Requirements) -> dict:
    request = setup.SetupRequest(BASE, sys.executable, Path("meshrun-0.1.0-py3-none-any.whl"), Identity("0.1.0", BUILD),
                                 requirements)
    done = subprocess.run(setup.setup_argv(request), cwd=workdir, capture_output=True, text=True, timeout=600)
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and "error" not in answer, done.stdout + done.stderr
    return answer


def test_a_src_layout_package_is_importable_from_the_venv_anywhere_once_set_up(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    (workdir / "src" / "mypkg").mkdir(parents=True)
    (workdir / "src" / "mypkg" / "__init__.py").write_text("WIDTH = 3\n")
    (workdir / "pyproject.toml").write_text(PYPROJECT)
    (workdir / host_setup.VENV).mkdir()
    (workdir / host_setup.STAMP).write_text(json.dumps({"build": BUILD}))
    requirements = project_requirements(workdir)
    assert requirements == Requirements(install_project=True)

    first = run_setup(workdir, requirements)
    assert first["actions"][:2] == [f"created venv {workdir / '.venv'}", f"venv reuses the packages of {sys.executable}"]
    assert len(first["actions"]) == 3
    assert re.fullmatch(r"installed the project itself \(pip install --no-deps -e \.\) in \d+ s", first["actions"][2])
    # Imported from the workdir's own files (editable), not through the script's folder or the cwd.
    (workdir / "src" / "mypkg" / "__init__.py").write_text("WIDTH = 4\n")
    seen = subprocess.run([str(workdir / ".venv/bin/python"), "-c", "import mypkg; print(mypkg.WIDTH, mypkg.__file__)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert seen.stdout.split() == ["4", str(workdir / "src" / "mypkg" / "__init__.py")], seen.stderr

    again = run_setup(workdir, requirements)
    assert again["actions"] == []  # the build files unchanged: nothing to do
    stamp = json.loads((workdir / host_setup.STAMP).read_text())
    assert stamp["build"] == BUILD and len(stamp["project"]) == 64


def test_the_build_files_digest_changes_with_any_of_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seen = {host_setup.build_digest()}
    (tmp_path / "setup.cfg").write_text("")  # an empty file is not an absent one
    seen.add(host_setup.build_digest())
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    seen.add(host_setup.build_digest())
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.replace("0.1", "0.2"))
    seen.add(host_setup.build_digest())
    assert len(seen) == 4
    assert host_setup.build_digest() == host_setup.build_digest()
