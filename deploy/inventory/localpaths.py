"""Paths on this machine that an inventory names: its `known_hosts`, each `identity`, and a local
host's relative `workdir`. Pure but for looking at the file system (what exists, where symlinks go).

A relative `known_hosts:` or `identity:` is read from the inventory file's own folder, never from the
shell's current directory (which changes with where `fab` runs). When it is not there but is in
the project, the project's is used: inventories written before this rule (meshrun's examples said
`known_hosts: inventory/known_hosts`) meant the project root. A known_hosts that exists in neither
is the inventory folder's (where `fab trust` creates it). `~` is this user's home.
"""

from __future__ import annotations

import os
from pathlib import Path

from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.inventory.yamlnodes import Where


def _is_relative(value: str) -> bool:
    return not (value == "~" or value.startswith("~/") or os.path.isabs(value))


def controller_file(value: str, inventory: Path, project: Path | None) -> Path:
    """The file `value` (as the inventory writes it) names on this machine, as an absolute path."""
    if not _is_relative(value):
        return Path(value).expanduser()
    beside = Path(os.path.abspath(inventory.parent / value))
    if project is not None and not os.path.lexists(beside) and os.path.lexists(project / value):
        return Path(os.path.abspath(project / value))
    return beside


def key_file(value: str, at: Where, project: Path | None) -> str:
    """An `identity`: it must be a file. A relative one becomes absolute (ssh, rsync and paramiko then
    read the same file from any directory); `~/…` and absolute ones stay as written."""
    found = controller_file(value, at.path, project)
    if not found.is_file():
        problem = "is not a file" if found.exists() else "does not exist"
        where = "" if not _is_relative(value) else " beside the inventory" if project is None else \
            " beside the inventory or in the project"
        raise at.fail(f"key file {shown(value)} {problem}{where}", "create the key (ssh-keygen) or correct the path")
    return str(found) if _is_relative(value) else value


def workdir_outside(workdir: str, project: Path) -> bool:
    """Does a local host's relative `workdir` lead out of the project (by `..` or through a symlink)?
    `~/…` and absolute workdirs are the user's explicit choice: never."""
    if not _is_relative(workdir):
        return False
    root = os.path.realpath(project)
    return os.path.commonpath([root, os.path.realpath(os.path.join(root, workdir))]) != root


def workdir_is_project(workdir: str, project: Path) -> bool:
    """Is a local host's `workdir` the project itself (`.`, or the project's own path)? Where the two
    are one, the host's `runs/<id>/` is the controller's run record (as deploy/edges/sync.is_project_itself)."""
    return os.path.realpath(os.path.join(project, os.path.expanduser(workdir))) == os.path.realpath(project)
