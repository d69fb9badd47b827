"""The files `fab sync --data` sends from SRC, as DEST will hold them: what the manifest lists.

rsync sends SRC with `--archive --copy-unsafe-links`. A regular file is sent as it is; a link that
stays inside SRC (rsync judges it by its text: `deploy/run/dataplan.unsafe_link`) is sent as a link,
and the file behind it is verified through it at DEST; a link that leaves SRC (a shard on a second
disk, `train -> /mnt/nas/imagenet/train`) is sent as what it leads to, a file or a whole folder,
so those files are listed and verified too. What such a link leads to must be there, and a link
loop (a folder that leads back into one above it) is refused: rsync would copy it without end.
A file reached through such a link whose name the code sync keeps home (an SSH key, known_hosts,
an inventory: deploy/run/syncset.is_private) is refused too: `extra -> ~/.ssh` would ship the
user's keys to every host. Every refusal is one InputError naming the path, and SRC is only read.
Each link leaving SRC is told with how many files went through it (`link_lines`), so the user sees
what left the dataset folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Iterator

from meshrun.layout import RUNS_DIR
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown_path, with_path
from meshrun.deploy.run.dataplan import DATA_MANIFEST, LEGACY_CACHE, PARTIAL_DIR, unsafe_link
from meshrun.deploy.run.syncset import is_private, original_name

# A name syncset.is_private keeps home holds one of these in its last part (its key, known_hosts and
# inventory rules all look at it, and `original_name` only ever cuts a name shorter): a cheap test that
# spares the full rules for almost every file of a large linked dataset.
_PRIVATE_HINTS = ("known_hosts", "id_", ".pem", ".key", ".yaml", ".yml")


@dataclass(frozen=True)
class Leaving:
    """A link leaving SRC, which rsync sends as its content: its name in SRC and at DEST, its text,
    and its path here."""
    name: str
    target: str
    path: str


@dataclass(frozen=True)
class _Folder:
    """A folder of SRC as rsync sends it: `rel` its name at DEST ("" for SRC), `path` where its entries
    are read; `via` the innermost link leaving SRC whose content it is (None inside SRC itself);
    `above` the (device, inode) of it and of every folder above it."""
    rel: str
    path: str
    via: Leaving | None
    above: frozenset[tuple[int, int]]


def data_files(source: Path) -> Iterator[tuple[str, str, Leaving | None]]:
    """(relative posix name, path, the link leaving SRC it is sent through or None) of each file DEST
    will hold: regular files and links to files, and the files of every link rsync sends as its
    content (`--copy-unsafe-links`: a link leaving SRC, whose target on a host would be missing or
    another). A link rsync keeps (inside SRC) stays one: a file behind it is read through it at DEST
    too, a linked folder's files are listed where they lie."""
    try:
        top = os.stat(source)
    except OSError as err:
        raise unreadable(source, err) from None
    stack = [_Folder("", str(source), None, frozenset({(top.st_dev, top.st_ino)}))]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder.path), key=lambda e: e.name)
        except OSError as err:  # its files would go unverified
            raise unreadable(err.filename or folder.path, err) from None
        for entry in entries:
            rel = f"{folder.rel}/{entry.name}" if folder.rel else entry.name
            try:
                found = _sent_as(entry, rel, folder)
            except OSError as err:
                raise unreadable(entry.path, err) from None
            if isinstance(found, _Folder):
                stack.append(found)
            elif found:
                _check_listable(rel, entry.path)
                via = found if isinstance(found, Leaving) else folder.via
                if via is not None:
                    _check_secret(rel, entry, via)
                yield rel, entry.path, via


def _sent_as(entry: os.DirEntry, rel: str, folder: _Folder) -> _Folder | Leaving | bool:
    """What rsync makes of one entry at DEST: a folder to walk, a file to list (True, or the link
    leaving SRC that is sent as that file), or nothing to list."""
    if not folder.rel and entry.name == DATA_MANIFEST:
        raise InputError(with_path("--data: ", entry.path, ": meshrun writes its own manifest under that name at "
                                   "DEST; rename or move yours"))
    if entry.name == LEGACY_CACHE:  # rsync's --exclude drops it at any depth
        return False
    link, target = "", ""
    if entry.is_symlink():
        target = os.readlink(entry.path)
        if not unsafe_link(target, rel):  # rsync keeps it a link
            _check_kept(entry.path, target, rel, folder)
            _check_partial(entry.name, entry.path)
            return os.path.isfile(entry.path)
        found, link = _referent(entry.path, target), entry.path
    elif entry.is_file(follow_symlinks=False):  # the common case, told by the folder listing alone
        return True
    else:
        found = entry.stat(follow_symlinks=False)
    via = Leaving(rel, target, link) if link else folder.via
    if not S_ISDIR(found.st_mode):
        return (via if link else True) if S_ISREG(found.st_mode) else False
    _check_partial(entry.name, entry.path)
    here = (found.st_dev, found.st_ino)
    if here in folder.above:  # rsync would copy it into itself without end
        culprit, aim = (via.path, via.target) if via is not None else (entry.path, "")
        raise InputError(with_path("--data: ", culprit, f" -> {shown_path(aim)}: the link leads back "
                                   "into a folder above it (a loop); remove it or point it elsewhere"))
    return _Folder(rel, entry.path, via, folder.above | {here})


def _referent(path: str, target: str) -> os.stat_result:
    """What a link leaving SRC leads to: rsync sends that, so it must be there (rsync's `symlink has
    no referent` would fail the whole transfer)."""
    try:
        return os.stat(path)
    except OSError as err:
        raise InputError(with_path("--data: ", path, f" -> {shown_path(target)}: the link leaves SRC, so what it "
                                   f"leads to is sent, but here it leads to nothing ({why(err)}); fix the link or "
                                   "move it out of SRC")) from None


def _check_kept(path: str, target: str, rel: str, folder: _Folder) -> None:
    """A link rsync keeps, inside a folder it sends as a link's content: rsync judges it against SRC,
    so one that climbs out of that folder would, on the hosts, lead into DEST instead."""
    if folder.via is not None and unsafe_link(target, rel[len(folder.via.name) + 1:]):
        raise InputError(with_path("--data: ", path, f" -> {shown_path(target)}: the link climbs out of "
                                   f"{shown_path(folder.via.path)}, whose content is sent, so on the hosts it would "
                                   "lead elsewhere; make it absolute or keep it inside that folder"))


def _check_secret(rel: str, entry: os.DirEntry, via: Leaving) -> None:
    """A file sent through a link leaving SRC, named like one the code sync keeps home, is refused: a
    link to ~/.ssh (or to a project's inventory/) would ship the user's keys to every host. Judged by
    its name from SRC, from the link's target and, for a link, by the name of the file it leads to."""
    if not any(hint in entry.name.casefold() for hint in _PRIVATE_HINTS) and not entry.is_symlink():
        return
    below = rel[len(via.name) + 1:]
    names = [rel, below] if below else [rel]
    if entry.is_symlink():
        names.append(os.path.basename(os.path.realpath(entry.path)))
    if any(secret_name(name) for name in names):
        raise InputError(with_path("--data: ", via.path, f" -> {shown_path(via.target)}: {shown_path(rel)} would be "
                                   "sent through this link, which leaves SRC, and is named like a file meshrun keeps "
                                   "home (an SSH key, known_hosts, an inventory); move it out of what the link leads "
                                   "to, or drop the link"))


def secret_name(name: str) -> bool:
    """syncset.is_private's judgement of a data file's name, less its `runs/` rule: that one keeps the
    project's run records home, and a dataset may well hold a `runs` folder of its own."""
    leaf = name.rpartition("/")[2]
    if not any(hint in leaf.casefold() for hint in _PRIVATE_HINTS):
        return False
    return is_private(leaf if original_name(name.partition("/")[0]) == RUNS_DIR else name)


def link_lines(through: Mapping[Leaving, int]) -> tuple[str, ...]:
    """One line per link leaving SRC, by name: what it leads to was sent, and how many files that was."""
    return tuple(f"{shown_path(link.name)} -> {shown_path(link.target)}: sent as its content "
                 f"({count} file{'' if count == 1 else 's'})"
                 for link, count in sorted(through.items(), key=lambda item: item[0].name))


def _check_partial(name: str, path: str) -> None:
    if name == PARTIAL_DIR and os.path.isdir(path):  # rsync would never send it, and its files would fail verification
        raise InputError(with_path("--data: ", path, ": meshrun keeps partly sent files under that name at DEST; "
                                   "delete it if a sync left it, or rename it"))


def _check_listable(rel: str, full: str) -> None:
    """The host's verifier reads the manifest as UTF-8 text, line by line (universal newlines): a name
    with a line break or with bytes that are not UTF-8 would be misread, and its file never checked."""
    try:
        rel.encode("utf-8")
        listable = "\n" not in rel and "\r" not in rel
    except UnicodeEncodeError:
        listable = False
    if not listable:
        raise InputError(with_path("--data: ", full, ": a name with a line break or bytes that are not UTF-8 "
                                   "cannot be listed in the sha256 manifest; rename it"))


def unreadable(path: Path | str, err: OSError) -> InputError:
    return InputError(with_path("--data: cannot read ", path, f": {why(err)}; make it readable or move it out of SRC"))


def why(err: OSError) -> str:
    """`permission denied`, or FileRefused's own words (`is a FIFO, not a regular file`)."""
    return err.strerror.lower() if err.strerror else str(err)
