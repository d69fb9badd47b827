"""Private home directories and the parts of the real /root they must still see.

Each sshd runs in its own mount namespace where /root is a bind of
``<state>/h<i>/home``: rsync to ``~/meshrun`` on three hosts lands in three
places (without this all "hosts" share one filesystem and one ~).

Gotcha (NOTES.md §3): hiding the real /root breaks every venv whose base
python is pyenv's under /root/.pyenv ("cannot execute: required file not
found"). So the usual tool dirs plus every top-level /root directory holding
the interpreter, its venv or the project checkout are bind-mounted back in.
CI may clone the repo to an unknown folder under /root, hence computed.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

REAL_HOME = Path("/root")
TOOL_DIRS = (".pyenv", ".local", ".cargo", ".rustup")


def _top_level_under(home: Path, path: Path) -> str | None:
    """First component of `path` below `home`, e.g. /root/ci/x/y -> "ci"."""
    try:
        rel = path.relative_to(home)
    except ValueError:
        return None
    return rel.parts[0] if rel.parts else None


def _venv_of(python: Path) -> Path | None:
    """The venv holding `python` (<venv>/bin/python with <venv>/pyvenv.cfg)."""
    venv = python.parent.parent
    return venv if (venv / "pyvenv.cfg").is_file() else None


def _venv_home(venv: Path) -> Path | None:
    """`home = ...` from pyvenv.cfg: the base interpreter's bin dir."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip())
    return None


def passthrough_dirs(
    python: str = sys.executable,
    repo_root: Path | None = None,
    extra: Iterable[Path] = (),
    real_home: Path = REAL_HOME,
) -> list[Path]:
    """Directories of the real /root to bind into every private home. `extra`:
    more paths that must stay visible (e.g. a state dir placed under /root,
    since sshd reads its config after /root is replaced)."""
    python_path = Path(python).absolute()
    candidates: list[Path] = [python_path, python_path.resolve()]
    venv = _venv_of(python_path)
    if venv is not None:
        candidates += [venv, venv.resolve()]
        home = _venv_home(venv)
        if home is not None:
            candidates += [home, home.resolve()]
    if python_path.resolve() == Path(sys.executable).resolve():
        candidates += [Path(sys.prefix), Path(sys.base_prefix).resolve()]
    if repo_root is not None:
        candidates += [repo_root.absolute(), repo_root.resolve()]
    for path in extra:
        candidates += [path.absolute(), path.resolve()]

    names = [name for name in TOOL_DIRS if (real_home / name).is_dir()]
    for path in candidates:
        top = _top_level_under(real_home, path)
        if top is not None and top not in names and (real_home / top).is_dir():
            names.append(top)
    return [real_home / name for name in names]


def mount_points_under(path: Path) -> list[str]:
    """Mount points at or below `path` in *our* mount namespace."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4]
        if mount_point == prefix or mount_point.startswith(prefix + "/"):
            found.append(mount_point)
    return found


def reset_home(home: Path, passthrough: Iterable[Path]) -> None:
    """Empty a private home and create the passthrough mount points.

    Safety: the binds live only in the sshd's private mount namespace, so here
    these are plain empty directories. If something *is* mounted below (e.g. a
    propagation mistake), refuse: rmtree would delete the real ~/.pyenv.
    """
    if home.exists():
        mounted = mount_points_under(home)
        if mounted:
            raise RuntimeError(f"refusing to clear {home}: mount points below it: {mounted}")
        shutil.rmtree(home)
    home.mkdir(parents=True)
    for src in passthrough:
        (home / src.name).mkdir()


def bind_commands(home: Path, passthrough: Iterable[Path]) -> list[list[str]]:
    """mount commands run inside the host's fresh mount namespace: binds first,
    then the home (with them, --rbind) over /root."""
    cmds = [["mount", "--bind", str(src), str(home / src.name)] for src in passthrough]
    cmds.append(["mount", "--rbind", str(home), str(REAL_HOME)])
    return cmds
