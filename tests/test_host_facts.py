"""The fact probe reads torch's versions from its files: check-network imports torch once per host
(in its all-reduce), not twice. Each case runs the probe as check-network ships it (`python -c
<source>`) against a stand-in torch whose `__init__` leaves a mark when it is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.host import facts

SOURCE = Path(facts.__file__).read_text()
VERSION_PY = "__version__ = '9.1.0+cu999'\ndebug = False\ncuda: Optional[str] = {cuda}\ngit_version = 'abc'\n"


def probe(tmp_path: Path, version_py: str | None, nccl: str | None = None) -> tuple[dict, bool]:
    """(the probe's answer, whether the stand-in torch was imported)."""
    site = tmp_path / "site"
    mark = tmp_path / "imported"
    if version_py is not None:
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text(
            f"open({str(mark)!r}, 'w').close()\n__version__ = '9.1.0-imported'\n"
            "class version: cuda = '99.0'\n"
            "class cuda:\n    class nccl:\n        version = staticmethod(lambda: (3, 1, 4))\n")
        (site / "torch" / "version.py").write_text(version_py)
    if nccl is not None:
        info = site / f"nvidia_nccl_cu13-{nccl}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: {nccl}\n")
    site.mkdir(exist_ok=True)
    # -S: this venv's own torch and NCCL package stay out of sight; PYTHONPATH: the stand-ins.
    done = subprocess.run([sys.executable, "-S", "-c", SOURCE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return {k: answer.get(k) for k in ("torch", "cuda", "nccl", "error")}, mark.exists()


def test_a_cpu_build_is_read_from_its_files_not_imported(tmp_path: Path) -> None:
    assert probe(tmp_path, VERSION_PY.format(cuda="None")) == (
        {"torch": "9.1.0+cu999", "cuda": None, "nccl": None, "error": None}, False)


def test_a_cuda_build_takes_nccl_from_its_package(tmp_path: Path) -> None:
    assert probe(tmp_path, VERSION_PY.format(cuda="'99.0'"), nccl="2.30.7") == (
        {"torch": "9.1.0+cu999", "cuda": "99.0", "nccl": "2.30.7", "error": None}, False)


@pytest.mark.parametrize("version_py, why", [
    (VERSION_PY.format(cuda="'99.0'"), "a CUDA build whose NCCL is linked in: only torch can say"),
    ("__version__ = compute()\n", "a version that is no literal"),
    ("this is not python(\n", "a version file that does not parse"),
])
def test_torch_is_imported_only_where_its_files_do_not_tell(tmp_path: Path, version_py: str, why: str) -> None:
    answer, imported = probe(tmp_path, version_py)
    assert imported, why
    assert answer == {"torch": "9.1.0-imported", "cuda": "99.0", "nccl": "3.1.4", "error": None}


def test_no_torch_is_named_as_before(tmp_path: Path) -> None:
    assert probe(tmp_path, None) == ({"torch": None, "cuda": None, "nccl": None,
                                      "error": "ModuleNotFoundError: No module named 'torch'"}, False)


def test_installed_versions_are_importlib_metadatas_for_every_distribution_here() -> None:
    """Read from the dist-info folders' names (importlib.metadata's import alone costs each host
    ~25 ms at every launch), they must be what importlib.metadata says, for all of this venv."""
    from importlib import metadata

    names = tuple(sorted({d.metadata["Name"] for d in metadata.distributions()}))
    assert len(names) > 20 and "torch" in names
    assert facts.installed_versions((*names, "no-such-project")) == {n: metadata.version(n) for n in names}


def test_an_egg_info_is_read_by_importlib_metadata(tmp_path: Path) -> None:
    """An egg-info folder's name need not hold the version: importlib.metadata reads its PKG-INFO."""
    (tmp_path / "Old_Proj.egg-info").mkdir()
    (tmp_path / "Old_Proj.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: old-proj\nVersion: 1.2\n")
    (tmp_path / "new_proj-3.4.dist-info").mkdir()  # no METADATA needed: the name says it
    code = f"{SOURCE}\nprint(json.dumps(installed_versions(('old-proj', 'new.proj', 'none'))))"
    done = subprocess.run([sys.executable, "-S", "-c", code, "x"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"old-proj": "1.2", "new.proj": "3.4"}


def test_the_answer_ends_with_the_hosts_clock_and_how_long_the_probe_had_run(tmp_path: Path) -> None:
    """The controller places the host's clock in its round trip (deploy/check/clocks.reading): the probe
    reads it last, and says how long its own code had run by then (longrun56, 1)."""
    site = tmp_path / "site"
    site.mkdir()
    before = time.time()
    done = subprocess.run([sys.executable, "-S", "-c", SOURCE, "light"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    after = time.time()
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert list(answer)[-2:] == ["clock_after_s", "clock"]
    assert before <= answer["clock"] <= after
    assert 0 <= answer["clock_after_s"] <= after - before
    assert before + answer["clock_after_s"] <= answer["clock"]
