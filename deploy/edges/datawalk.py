"""The files `fab sync --data` sends from SRC, as DEST will hold them: what the manifest lists.

rsync sends SRC with `--archive --copy-unsafe-links`. A regular file is sent as it is; a link that
stays inside SRC (rsync judges it by its text: `deploy/run/dataplan.unsafe_link`) is sent as a link,
and the file behind it is verified through it at DEST; a link that leaves SRC (a shard on a second
disk, `train -> /mnt/nas/imagenet/train`) is sent as what it leads to, a file or a whole folder,
so those files are listed and verified too. What such a link leads to must be there, and a link
loop (a folder that leads back into one above it) is refused: rsync would copy it without end.
Every refusal is one InputError naming the path, and SRC is only read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Iterator

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown_path, with_path
from meshrun.deploy.run.dataplan import DATA_MANIFEST, LEGACY_CACHE, PARTIAL_DIR, unsafe_link


@dataclass(frozen=True)
class _Folder:
    """A folder of SRC as rsync sends it: `rel` its name at DEST ("" for SRC), `path` where its entries
    are read; `link` the innermost link leaving SRC whose content it is (its path here, "" inside SRC
    itself), that link's `target` and its name at DEST (`base`); `above` the (device, inode) of it and
    of every folder above it."""
    rel: str
    path: str
    link: str
    target: str
    base: str
    above: frozenset[tuple[int, int]]


def data_files(source: Path) -> Iterator[tuple[str, str]]:
    """(relative posix name, path) of each file DEST will hold: regular files and links to files, and
    the files of every link rsync sends as its content (`--copy-unsafe-links`: a link leaving SRC,
    whose target on a host would be missing or another). A link rsync keeps (inside SRC) stays one:
    a file behind it is read through it at DEST too, a linked folder's files are listed where they lie."""
    try:
        top = os.stat(source)
    except OSError as err:
        raise unreadable(source, err) from None
    stack = [_Folder("", str(source), "", "", "", frozenset({(top.st_dev, top.st_ino)}))]
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
                yield rel, entry.path


def _sent_as(entry: os.DirEntry, rel: str, folder: _Folder) -> _Folder | bool:
    """What rsync makes of one entry at DEST: a folder to walk, a file to list (True), or nothing to list."""
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
    if not S_ISDIR(found.st_mode):
        return S_ISREG(found.st_mode)
    _check_partial(entry.name, entry.path)
    here = (found.st_dev, found.st_ino)
    if here in folder.above:  # rsync would copy it into itself without end
        culprit, aim = (link, target) if link else (folder.link, folder.target)
        raise InputError(with_path("--data: ", culprit or entry.path, f" -> {shown_path(aim)}: the link leads back "
                                   "into a folder above it (a loop); remove it or point it elsewhere"))
    inner = (link, target, rel) if link else (folder.link, folder.target, folder.base)
    return _Folder(rel, entry.path, *inner, folder.above | {here})


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
    if folder.link and unsafe_link(target, rel[len(folder.base) + 1:]):
        raise InputError(with_path("--data: ", path, f" -> {shown_path(target)}: the link climbs out of "
                                   f"{shown_path(folder.link)}, whose content is sent, so on the hosts it would lead "
                                   "elsewhere; make it absolute or keep it inside that folder"))


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
