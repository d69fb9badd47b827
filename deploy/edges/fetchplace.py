"""Placing what a fetch staged: a host's tree into `runs/<id>/hosts/<host>/`, and the assembly of
`runs/<id>/checkpoints/` (deploy/edges/fetch.py brings and checks; deploy/commands/fetch.py decides).

Each staged file is fsynced and renamed into place (`os.replace`), so a file appears under its
final name whole or not at all; a file that differs from one already here is never overwritten
unless `force` or it is still what an earlier fetch brought (a log or metrics file the host has
since grown, a file of the host's own tree the last fetch placed, or a `best.pt` the controller's
own manifest lists with that sha256, from a host as new; a step's checkpoint is never replaced),
and nothing is written through a link or outside the target.

The staged tree is walked without recursion (`staging.walk`) and no deeper than MAX_DEPTH: a
folder below that is reported, not placed, and removed from staging.

A checkpoint is read as few times as the rules allow (a 10 GB one costs seconds a read, and the
fetch gives itself PLACE_S after the transfer): the digest made when the staged copy was checked
is passed on (`known`), a copy here is read only when a comparison needs it, and the assembly
copies and checks in one read and skips what `checkpoints/` already holds
(tests/test_fetch_hash_passes.py counts the bytes).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from meshrun.fsutil import copy_hashed, fsync_dir, sha256_file
from meshrun.deploy.edges.digestmemo import Digests, stat_key
from meshrun.deploy.edges.fetch import REPORTED_SKIPS, FetchReport
from meshrun.deploy.edges.staging import MAX_DEPTH, PARTIAL_DIR, is_regular, walk
from meshrun.deploy.run.manifest import shown

READ_EACH_TIME = Digests()


def place(source: Path, target: Path, report: FetchReport, force: bool, prefix: str = "",
          ours: Mapping[str, str] | None = None, on_placed: Callable[[str, str], None] | None = None,
          grow: bool = True, known: Mapping[str, str] | None = None,
          here: Digests = READ_EACH_TIME) -> None:
    """Move the regular files under `source` into `target`, each atomically: new ones land,
    identical ones are dropped, a differing local file is kept (a conflict) unless `force` or it
    is still what meshrun put there: a byte prefix of the new copy (a log that grew: none of its
    bytes is lost; not with `grow` off, for checkpoints, which are written whole: a host could
    append to a verified one), or the sha256 `ours` gives for its relative name. Folders deeper than
    MAX_DEPTH are refused (a report line) and left in `source`. `on_placed(relative name, sha256)`
    as each file is here as the host sent it, so a caller cut off midway still knows which are.
    `known`: the sha256 of files of `source` this fetch has already read (a checkpoint checked
    against the host's manifest, one copied into the assembly), by relative name: not read again.
    A file here is read only when its size is the new copy's or an earlier fetch recorded it, by
    `here` (a `DigestMemo`: not again while unchanged; told of each file placed)."""
    deep: list[Path] = []
    found = _regular_files(source, deep)
    report.refused += deep_lines(report.host, [prefix + shown(d.relative_to(source).as_posix(), limit=200)
                                               for d in deep])
    for src in found:
        rel = src.relative_to(source)
        dst = target / rel
        name = prefix + shown(rel.as_posix(), limit=200)
        if not _plain_dirs_to(target, dst):
            report.refused.append(f"host '{report.host}': {name}: a folder on its way here is a link or a file; "
                                  "not placed")
            continue
        if os.path.lexists(dst) and not is_regular(dst):  # a folder or link of yours: never replaced
            report.conflicts.append(name)
            continue
        digest = (known or {}).get(rel.as_posix()) or sha256_file(src)
        recorded = (ours or {}).get(rel.as_posix())
        if not os.path.lexists(dst):
            report.new.append(name)
        elif (local := _local_digest(dst, src, digest, recorded, here)) == digest:
            report.unchanged.append(name)
        elif force or (recorded is not None and local == recorded) or (grow and _grew(dst, src)):
            report.updated.append(name)
        else:
            report.conflicts.append(name)
            continue
        report.placed[rel.as_posix()] = digest
        if name not in report.unchanged:
            staged = stat_key(src)
            _commit(src, dst)
            here.placed(dst, digest, staged)
        if on_placed is not None:
            on_placed(rel.as_posix(), digest)


def _local_digest(dst: Path, src: Path, digest: str, recorded: str | None, here: Digests) -> str | None:
    """`dst`'s sha256 where place compares it: with the new copy's, `digest` (only bytes of its
    size can be the same) or with what an earlier fetch `recorded` placing it. None: neither can
    match. A staged file rsync linked to `dst` (the basis, unchanged on the host) is `dst`: its bytes."""
    here_stat, staged_stat = os.lstat(dst), os.lstat(src)
    if os.path.samestat(here_stat, staged_stat):
        return digest
    if recorded is None and here_stat.st_size != staged_stat.st_size:
        return None
    return here.digest(dst)


def _grew(old: Path, new: Path) -> bool:
    """`old`'s bytes are a proper prefix of `new`'s: a file that was only appended to."""
    if os.lstat(old).st_size >= os.lstat(new).st_size:
        return False
    with open(old, "rb") as a, open(new, "rb") as b:
        while chunk := a.read(1 << 20):
            if b.read(len(chunk)) != chunk:
                return False
    return True


def stage_verified(source: Path, digests: dict[str, str], out: Path, target: Path,
                   here: Digests = READ_EACH_TIME) -> tuple[dict[str, str], dict[str, str]]:
    """Copy into `out` the checkpoints of `source` that still match their verified sha256: what
    `runs/<id>/checkpoints/` (`target`) is assembled from (its manifest the controller writes
    afterwards). Each is read once, checked as it is copied. One that `target` already holds, the
    same bytes in a regular file of a real folder, is not copied: placing it would only find it
    unchanged. Returns (staged, already there), name -> sha256 each."""
    out.mkdir(parents=True, exist_ok=True)
    staged, already = {}, {}
    target_is_folder = _is_real_folder(target)
    for name, digest in digests.items():
        if not is_regular(source / name):
            continue
        at = target / name
        if (target_is_folder and is_regular(at) and os.lstat(at).st_size == os.lstat(source / name).st_size
                and here.digest(at) == digest):
            already[name] = digest
        elif copy_hashed(source / name, out / name) == digest:
            staged[name] = digest
        else:  # changed since it was checked (yours, edited under hosts/<host>/): not assembled
            (out / name).unlink()
    return staged, already


def note_unchanged(report: FetchReport, already: Mapping[str, str], prefix: str,
                   on_placed: Callable[[str, str], None] | None) -> None:
    """Report what `stage_verified` found already there as place reports a file it finds unchanged."""
    for name, digest in already.items():
        report.unchanged.append(prefix + shown(name, limit=200))
        report.placed[name] = digest
        if on_placed is not None:
            on_placed(name, digest)


def _is_real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def deep_lines(host: str, names: list[str]) -> list[str]:
    """One report line per folder too deep to bring home (at most REPORTED_SKIPS, then a count)."""
    lines = [f"host '{host}': {name}: a folder more than {MAX_DEPTH} levels deep; not placed"
             for name in names[:REPORTED_SKIPS]]
    if len(names) > REPORTED_SKIPS:
        lines.append(f"host '{host}': {len(names) - REPORTED_SKIPS} more folders more than {MAX_DEPTH} levels deep; "
                     "not placed")
    return lines


def _regular_files(top: Path, deep: list[Path]) -> list[Path]:
    """Regular files under `top`, sorted; links are not followed, partial-dirs are skipped, and
    folders deeper than MAX_DEPTH are added to `deep`."""
    found = []
    for here, dirs, files in walk(top, deep):
        dirs[:] = [d for d in dirs if d != PARTIAL_DIR]
        found += [p for p in (here / f for f in files) if is_regular(p)]
    return sorted(found)


def _plain_dirs_to(target: Path, dst: Path) -> bool:
    """Every folder from `target` down to `dst`'s parent is a real folder, or absent and made."""
    folders = [target]
    for part in dst.relative_to(target).parts[:-1]:
        folders.append(folders[-1] / part)
    for folder in folders:
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                return False
        except FileNotFoundError:
            folder.mkdir(parents=folder == target)
    return True


def _commit(src: Path, dst: Path) -> None:
    """Make `src`'s bytes durable, then rename it over `dst` (same filesystem: atomic)."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(src, dst)
    fsync_dir(dst.parent)
