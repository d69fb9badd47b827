"""Pure helpers that turn an argv into the one shell string SSH carries, quoted with shlex.

SSH hands the remote login shell a single string, so every argument is quoted; the only
unquoted text is our own fixed syntax (`cd`, `&&`, `exec`, `"$HOME"`). A leading `~/` in an
inventory path (workdir, python) becomes `"$HOME"/'rest'`, since a quoted `~` never expands.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence


def shell_path(path: str) -> str:
    """`path` quoted for a POSIX shell, with a leading `~` meaning the login user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def make_workdir(workdir: str) -> str:
    """The shell command that makes `workdir` (and its parents), quiet when it exists already."""
    return f"mkdir -p {shell_path(workdir)}"


def remote_command(workdir: str, argv: Sequence[str], *, create_workdir: bool = False) -> str:
    """`cd WORKDIR && exec ARGV`, every piece quoted. argv[0] may start with `~/`."""
    if not argv:
        raise ValueError("empty argv")
    cd = f"cd {shell_path(workdir)}"
    if create_workdir:
        cd = f"{make_workdir(workdir)} && {cd}"
    rest = " ".join(shlex.quote(a) for a in argv[1:])
    return f"{cd} && exec {shell_path(argv[0])}" + (f" {rest}" if rest else "")


def local_workdir(workdir: str, project_root: Path) -> Path:
    """A local host's workdir: `~` is this user's home; a relative path is inside the project."""
    path = Path(workdir).expanduser()
    return path if path.is_absolute() else (project_root / path)
