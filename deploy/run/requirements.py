"""What a project asks hosts to install beside meshrun, pure: `fab setup` installs it in each
host's venv. `requirements.txt` at the project root wins; else `pyproject.toml`'s
`[project].dependencies`. meshrun's own clone declares only meshrun's dependencies, which the
wheel brings already, so a project named meshrun adds nothing.

Setup records on each host the digest of what it installed (deploy/host/setup.py's
requirements_digest); `declared` computes the same digest here, so every launch can tell a host
set up with other requirements than the project's now (deploy/check/sincesetup.py)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from meshrun.fsutil import read_regular
from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import read_input
from meshrun.deploy.inventory.shown import one_line, with_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 controllers get tomli from meshrun's dependencies
    import tomli as tomllib

REQUIREMENTS_FILE = "requirements.txt"
PYPROJECT_MAX = 1 << 20


@dataclass(frozen=True)
class Requirements:
    file: str | None = None  # relative to the project (and so to each host's workdir)
    lines: tuple[str, ...] = ()  # from pyproject.toml

    @property
    def declared(self) -> bool:
        return bool(self.file or self.lines)


def project_requirements(root: Path) -> Requirements:
    if (root / REQUIREMENTS_FILE).is_file():
        return Requirements(file=REQUIREMENTS_FILE)
    path = root / "pyproject.toml"
    if not path.is_file():
        return Requirements()
    fix = f"fix it, or declare the project's requirements in {REQUIREMENTS_FILE}"
    data = read_input(path, PYPROJECT_MAX, "the project's", fix)
    try:
        project = tomllib.loads(data.decode("utf-8")).get("project") or {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise InputError(with_path("", path, f": not valid TOML ({one_line(str(err), 80)}); {fix}")) from None
    if not isinstance(project, dict):
        raise InputError(with_path("", path, f": [project] is not a table; {fix}"))
    deps = project.get("dependencies") or []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise InputError(f"{path}: [project].dependencies must be a list of requirement strings")
    return Requirements() if project.get("name") == "meshrun" else Requirements(lines=tuple(deps))


@dataclass(frozen=True)
class Declared:
    """The project's requirements as setup would install them now: their digest and how to name them."""
    digest: str  # sha256 hex, as deploy/host/setup.py records it; "" when the project declares none
    source: str  # "requirements.txt" or "pyproject.toml's dependencies"


def requirements_digest(requirements: Requirements, file_bytes: bytes = b"") -> str:
    """What deploy/host/setup.py's requirements_digest records for `requirements`: sha256 of the
    file's bytes (`file_bytes`, the file as synced to the host), or of the lines joined by "\n";
    "" when there are none. A copy of that host-side rule (that file travels alone); tests hold them equal."""
    if requirements.file:
        return hashlib.sha256(file_bytes).hexdigest()
    return hashlib.sha256("\n".join(requirements.lines).encode("utf-8")).hexdigest() if requirements.lines else ""


def declared(root: Path) -> Declared | None:
    """The digest setup would record for this project now; None when it cannot be told (an invalid
    pyproject.toml, an unreadable requirements.txt): the launch then says nothing of it."""
    try:
        requirements = project_requirements(root)
        data = read_regular(root / requirements.file, PYPROJECT_MAX) if requirements.file else b""
    except (InputError, OSError):
        return None
    source = "pyproject.toml's dependencies" if requirements.lines else REQUIREMENTS_FILE
    return Declared(requirements_digest(requirements, data), source)
