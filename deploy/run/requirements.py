"""What a project asks hosts to install beside meshrun, pure: `fab setup` installs it in each
host's venv. `requirements.txt` at the project root wins; else `pyproject.toml`'s
`[project].dependencies`. meshrun's own clone declares only meshrun's dependencies, which the
wheel brings already, so a project named meshrun adds nothing.

And the project itself, when it is a package pip can install (a `setup.py`, or a `pyproject.toml`
with a `[project]` or `[build-system]` table): a researcher who ran `pip install -e .` at home
imports the package from any script (one in a subfolder importing `mypkg`, a `src/` layout), and a
host whose venv lacks it fails at the first import. Setup installs it editable and without its
dependencies (`pip install --no-deps -e .` in the workdir: the code synced later is the code
imported; the dependencies are the requirements above), again when its build files change.

Setup records on each host the digest of what it installed (deploy/host/setup.py's
requirements_digest); `declared` computes the same digest here, so every launch can tell a host
set up with other requirements than the project's now (deploy/check/sincesetup.py)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from meshrun.fsutil import FileRefused, read_regular
from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import read_input
from meshrun.deploy.inventory.shown import one_line, with_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 controllers get tomli from meshrun's dependencies
    import tomli as tomllib

REQUIREMENTS_FILE = "requirements.txt"
SETUP_PY = "setup.py"
# What pip reads to build the project: deploy/host/setup.py's BUILD_FILES (that file travels alone); tests hold them equal.
BUILD_FILES = ("pyproject.toml", SETUP_PY, "setup.cfg")
BUILD_FILE_MAX = 16 << 20
PYPROJECT_MAX = 1 << 20
FIX = f"fix it, or declare the project's requirements in {REQUIREMENTS_FILE}"  # a pyproject.toml setup cannot read


@dataclass(frozen=True)
class Requirements:
    file: str | None = None  # relative to the project (and so to each host's workdir)
    lines: tuple[str, ...] = ()  # from pyproject.toml
    install_project: bool = False  # the project itself, editable: a setup.py, or [project] or [build-system]

    @property
    def declared(self) -> bool:
        return bool(self.file or self.lines)


def project_requirements(root: Path) -> Requirements:
    """What setup installs for the project at `root`. A pyproject.toml that cannot be read is one line
    naming it, unless requirements.txt is there, which wins over it (the project itself is then not
    installed from it: pip would fail on it the same way)."""
    path = root / "pyproject.toml"
    listed = (root / REQUIREMENTS_FILE).is_file()
    try:
        document = _pyproject(path) if path.is_file() else {}
    except InputError:
        if not listed:
            raise
        return Requirements(file=REQUIREMENTS_FILE, install_project=(root / SETUP_PY).is_file())
    project = document.get("project", {})
    if not isinstance(project, dict):
        raise InputError(with_path("", path, f": [project] is not a table; {FIX}"))
    if project.get("name") == "meshrun":
        return Requirements()
    install = (root / SETUP_PY).is_file() or "project" in document or "build-system" in document
    if listed:
        return Requirements(file=REQUIREMENTS_FILE, install_project=install)
    deps = project.get("dependencies") or []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise InputError(f"{path}: [project].dependencies must be a list of requirement strings")
    return Requirements(lines=tuple(deps), install_project=install)


def _pyproject(path: Path) -> dict:
    data = read_input(path, PYPROJECT_MAX, "the project's", FIX)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise InputError(with_path("", path, f": not valid TOML ({one_line(str(err), 80)}); {FIX}")) from None


@dataclass(frozen=True)
class Declared:
    """The project's requirements as setup would install them now: their digest and how to name them."""
    digest: str  # sha256 hex, as deploy/host/setup.py records it; "" when the project declares none
    source: str  # "requirements.txt" or "pyproject.toml's dependencies"
    build: str | None = None  # `build_digest`, where setup installs the project itself; else None


def requirements_digest(requirements: Requirements, file_bytes: bytes = b"") -> str:
    """What deploy/host/setup.py's requirements_digest records for `requirements`: sha256 of the
    file's bytes (`file_bytes`, the file as synced to the host), or of the lines joined by "\n";
    "" when there are none. A copy of that host-side rule (that file travels alone); tests hold them equal."""
    if requirements.file:
        return hashlib.sha256(file_bytes).hexdigest()
    return hashlib.sha256("\n".join(requirements.lines).encode("utf-8")).hexdigest() if requirements.lines else ""


def build_digest(root: Path) -> str | None:
    """What deploy/host/setup.py's build_digest records of the project's BUILD_FILES once it installed
    the project from them: sha256 over each, named, with its length (-1: absent). A copy of that
    host-side rule; tests hold them equal. None when one cannot be read here (no word then)."""
    digest = hashlib.sha256()
    for name in BUILD_FILES:
        try:
            data: bytes | None = read_regular(root / name, BUILD_FILE_MAX)
        except FileNotFoundError:
            data = None
        except (OSError, FileRefused):
            return None
        digest.update(f"{name} {len(data) if data is not None else -1}\n".encode() + (data or b""))
    return digest.hexdigest()


def declared(root: Path) -> Declared | None:
    """The digest setup would record for this project now; None when it cannot be told (an invalid
    pyproject.toml, an unreadable requirements.txt): the launch then says nothing of it."""
    try:
        requirements = project_requirements(root)
        data = read_regular(root / requirements.file, PYPROJECT_MAX) if requirements.file else b""
    except (InputError, OSError):
        return None
    source = "pyproject.toml's dependencies" if requirements.lines else REQUIREMENTS_FILE
    return Declared(requirements_digest(requirements, data), source,
                    build_digest(root) if requirements.install_project else None)
