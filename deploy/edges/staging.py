"""The staging side of a fetch: where rsync writes a host's run directory (`.incoming/<host>/`),
the folders walked and removed there, and the basis rsync may read while it writes.

Trees are walked with a stack of our own, never by recursion (Python 3.11's `os.walk` and
`shutil.rmtree` recurse once per level: a host serving a thousand nested folders would stop
every fetch), and no deeper than MAX_DEPTH.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

PARTIAL_DIR = ".rsync-partial"  # relative, so rsync also refuses to take one from the host
MAX_DEPTH = 64  # folders below a run directory; a trainer's tree is a few deep (hosts/<host>/torchrun/...)


@dataclass(frozen=True)
class Staging:
    """`.incoming/<host>/`: rsync's tree and, apart from it, rsync's temp files."""

    root: Path

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"


def walk(top: Path, deep: list[Path]) -> Iterator[tuple[Path, list[str], list[str]]]:
    """`os.walk(top)` top-down, on a stack instead of recursion, and never into a link (a link,
    to a folder or not, is among the files). A folder more than MAX_DEPTH below `top` is not
    entered but added to `deep`; a name the caller takes out of the folder list is not entered."""
    stack = [(top, 0)]
    while stack:
        here, depth = stack.pop()
        try:
            with os.scandir(here) as listing:
                entries = [(e.name, _is_folder(e)) for e in listing]
        except OSError:
            continue  # as os.walk: a folder that cannot be listed is passed over
        dirs = [name for name, folder in entries if folder]
        yield here, dirs, [name for name, folder in entries if not folder]
        for name in reversed(dirs):
            if depth < MAX_DEPTH:
                stack.append((here / name, depth + 1))
            else:
                deep.append(here / name)


def remove_tree(top: Path) -> None:
    """Delete `top` and everything under it, without recursion or long paths: a subfolder is first
    renamed up into `top` (one rename, same filesystem), so no path here grows with the depth."""
    if not stat.S_ISDIR(os.lstat(top).st_mode):
        os.unlink(top)  # a link is removed, never followed
        return
    pending, moved = [top], 0
    while pending:
        here = pending.pop()
        with os.scandir(here) as listing:
            entries = [(e.name, _is_folder(e)) for e in listing]
        for name, folder in entries:
            if not folder:
                os.unlink(here / name)
            elif here == top:
                pending.append(top / name)
            else:
                while os.path.lexists(top / f"{moved}.gone"):
                    moved += 1
                os.rename(here / name, top / f"{moved}.gone")
                pending.append(top / f"{moved}.gone")
        if here != top:
            os.rmdir(here)
    os.rmdir(top)


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def fetch_basis(landed: Path) -> Path | None:
    """`hosts/<host>/` as rsync's `--link-dest` for that host's next fetch, or None (every file
    then comes whole, as on a first fetch): only a real folder whose every entry, MAX_DEPTH deep
    at most, is a real folder or a regular file, every folder listable.

    Safe with an untrusted host: the basis is only read, by the receiving rsync here (rsync sends
    basis options to a server only when the server receives: the host never sees this path), and
    what rsync makes from it lands in staging (a hard link to an unchanged file, never written
    through: `fetch_argv`), checked and placed as a file the host sent whole.
    It holds what this same host sent before (place() makes real folders and renames regular
    files there, never a link) and your edits of those. The host learns, for a name it serves,
    the size and block checksums of the file of that name here: its own earlier bytes or your
    edit of them, never another host's file or one outside this folder. A folder here that is a
    link (yours: no fetch makes one) would lead rsync's reads out of it: no basis then. A file
    here with the host's size and time is taken as the host's, unchanged (rsync's quick check, as
    on every sync): an edit that keeps both is not replaced; a checkpoint so taken is still
    checked against the host's manifest."""
    try:
        if not stat.S_ISDIR(os.lstat(landed).st_mode):
            return None
    except OSError:
        return None
    return landed.absolute() if _plain_tree(landed) else None


def _plain_tree(top: Path) -> bool:
    stack = [(top, 0)]
    while stack:
        here, depth = stack.pop()
        try:
            with os.scandir(here) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False) and depth < MAX_DEPTH:
                        stack.append((Path(entry.path), depth + 1))
                    elif not entry.is_file(follow_symlinks=False):
                        return False  # a link, pipe, device, or a folder too deep
        except OSError:
            return False  # a folder that cannot be listed may hide a link
    return True
