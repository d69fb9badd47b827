"""`fab sync --data`: files a previous sync put at DEST that SRC no longer has are removed there,
so that an ImageFolder or a glob on the host stops training on images the researcher deleted.

What meshrun put at DEST is what its manifest there (`.meshrun-manifest.sha256`) lists. Before
the new transfer overwrites it, the host is asked for a digest of the names it lists (`same_names`,
one command over the open session): the same names as the new manifest's, there is nothing to
remove. Else the old one is fetched with rsync (the same transport as the data)
into the controller's private staging folder, if it is no larger than `dataplan.old_bound` allows:
a small multiple of this SRC's own listing. A larger one is not fetched, nothing is removed, and
the result says so in one line: the host's file must not set what the controller holds or sifts.
It is read line by line, and only the names to remove are kept: those it lists that the new
manifest lacks and that do not lexist in SRC (deploy/run/dataplan.py). They are then removed on
the host by a short script over the session: component by component under DEST,
never through a link (O_NOFOLLOW), and each folder the removal leaves empty goes too (an empty
class folder is an ImageFolder error). Anything else at DEST stays: the host's own files, a
`.venv`, another sync's `.meshrun-partial/`.

It runs before the transfer: a removal that fails leaves the old manifest in place, so the next
sync still knows what to remove. Every name comes from the host, so none is ever sent anywhere.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sync import PROTECT_ARGS, remote_path, remote_spec, ssh_argv
from meshrun.deploy.edges.sshexec import NotFinished
from meshrun.deploy.edges.transport import CommandResult, Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.shown import listing, shown_path
from meshrun.deploy.run.answers import MISSING, Answer, is_int, said
from meshrun.deploy.run.dataplan import (DATA_MANIFEST, LINE_BYTES_MAX, batches, manifest_names, network_hint,
                                         old_bound, stale_names)
from meshrun.deploy.run.shell import local_workdir
from meshrun.fsutil import open_regular, size_text

OVER_MAX_SIZE = b" is over max-size"  # rsync's word (`--info=skip1`) for a file --max-size left behind
ARGV_BUDGET = 64 << 10  # bytes of quoted names per removal command: `sh -c` takes one argument of 128 KiB
# rsync: 23, the file could not be read (no DEST yet, a first sync); 24, it vanished while read.
NOT_THERE_EXITS = (0, 23, 24)


def dest_path(host: Host, dest: str, root: Path) -> str:
    """DEST as rsync reaches it: a path here for a local host, `HOST:PATH` (relative to the login
    home) for a remote one."""
    if host.is_local:
        return dest if dest.startswith("/") else str(local_workdir(host.workdir, root) / dest)
    return remote_spec(host.ssh_host, dest if dest.startswith("/") else f"{remote_path(host.workdir)}/{dest}")


def fetch_manifest_argv(host: Host, dest: str, root: Path, known_hosts: Path | None, into: Path,
                        bound: int) -> list[str]:
    """DEST's manifest into the folder `into`: without --archive, a link in its place is skipped
    (not followed), and one larger than `bound` bytes is not taken (rsync says so: OVER_MAX_SIZE)."""
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), f"--max-size={bound}", "--info=skip1"]
    if not host.is_local:
        argv += ["-e", shlex.join(ssh_argv(host, known_hosts))]
    return argv + [f"{dest_path(host, dest, root)}/{DATA_MANIFEST}", f"{into}/"]


@dataclass(frozen=True)
class Stale:
    names: tuple[str, ...]  # to remove at DEST: the old manifest lists them, the new one and SRC do not
    notes: tuple[str, ...] = ()  # why nothing was looked for, one line each (the old manifest over its bound)


def stale_at_dest(host: Host, dest: str, root: Path, known_hosts: Path | None, into: Path, deadline: float,
                  manifest: Mapping[str, str], in_src: Callable[[str], bool], listing_bytes: int) -> Stale:
    """What the previous sync left at DEST that SRC no longer has, from its manifest there: none when
    it has none, and none (with a note) when it is larger than `old_bound(listing_bytes)`, the size of
    SRC's listing (the new one, or its last build's if larger)."""
    bound = old_bound(listing_bytes)
    into.mkdir(mode=0o700)
    over: list[bytes] = []
    run_rsync(fetch_manifest_argv(host, dest, root, known_hosts, into, bound), host=host.name, what="data sync",
              timeout=max(0.0, deadline - time.monotonic()), hint=network_hint(host.name), success=NOT_THERE_EXITS,
              on_line=lambda line: over.append(line) if line.rstrip().endswith(OVER_MAX_SIZE) else None)
    try:
        with _opened(into / DATA_MANIFEST) as handle:
            if over or os.fstat(handle.fileno()).st_size > bound:
                return Stale((), (too_large(dest, bound),))
            return Stale(stale_names(manifest_names(_lines(handle)), manifest, in_src))
    except FileNotFoundError:
        return Stale((), (too_large(dest, bound),) if over else ())
    except OSError:  # not a file, or unreadable: nothing is known to be meshrun's
        return Stale(())


# Runs on the host with its python: the sha256 of the names DEST/<argv[2]> (DATA_MANIFEST) lists, each
# followed by a newline, in its order (`names_digest`); null when there is no such regular file.
OLD_NAMES = """
import hashlib, json, os, re, stat, sys
line = re.compile(rb"[0-9a-f]{64}  (.+)")
try:
    fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
except OSError:
    print("null")
    sys.exit()
with os.fdopen(fd, "rb") as old:
    if not stat.S_ISREG(os.fstat(old.fileno()).st_mode):
        print("null")
        sys.exit()
    names = hashlib.sha256()
    for text in old:
        found = line.fullmatch(text.rstrip(b"\\n"))
        if found:
            names.update(found[1] + b"\\n")
print(json.dumps(names.hexdigest()))
"""


# The names of a 256 MiB manifest (OLD_MAX) hash in about a second: a host that has not answered by
# then is left to the fetch, whose rsync gives up after RSYNC_IO_TIMEOUT_S of silence, not the sync's whole deadline.
NAMES_TIMEOUT_S = 20.0


def names_digest(manifest: Mapping[str, str]) -> str:
    """What OLD_NAMES answers for a manifest of these names, written as datasync.manifest_bytes writes it."""
    digest = hashlib.sha256()
    for name in manifest:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def same_names(session: Session, python: str, dest: str, manifest: Mapping[str, str], deadline: float) -> bool:
    """Whether the manifest at DEST lists exactly the new manifest's names, in its order, as the host
    says: then the previous sync left nothing SRC no longer has, and the old manifest need not be
    fetched (an unchanged dataset, or changed contents under the same names: the common resync). The
    host's word decides only what is removed from its own DEST: one that says so falsely keeps its
    own stale files; an answer that is not a digest is "not the same"."""
    left = max(0.0, min(NAMES_TIMEOUT_S, deadline - time.monotonic()))
    try:
        result = session.run([python, "-c", OLD_NAMES, dest, DATA_MANIFEST], timeout=left)
        answer = result.last_json()
    except NotFinished:  # took the command, says nothing: the fetch's rsync, with its I/O timeout, judges it
        return False
    except (ValueError, IndexError):
        return False
    return isinstance(answer, str) and answer == names_digest(manifest)


def too_large(dest: str, bound: int) -> str:
    return (f"data {shown_path(dest)}: the {DATA_MANIFEST} a previous sync left there is over {size_text(bound)}, "
            "more than this SRC's listing explains, so it was not read and nothing was removed; delete there what "
            "SRC no longer has (or that file), then sync again")


def _opened(path: Path) -> BinaryIO:
    """`path` to read, when it is a regular file: opened without blocking and judged by fstat."""
    fd = open_regular(path)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _lines(handle: BinaryIO) -> Iterator[bytes]:
    """The file's lines without their newline, one at a time; a line longer than any manifest line
    meshrun writes is skipped whole, never held."""
    while line := handle.readline(LINE_BYTES_MAX + 1):
        if line.endswith(b"\n"):
            yield line[:-1]
        elif len(line) <= LINE_BYTES_MAX:  # the last line, without a newline
            yield line
        else:
            while line and not line.endswith(b"\n"):
                line = handle.readline(LINE_BYTES_MAX + 1)


# Runs on the host with its python: removes each name under DEST (argv[1]) without following links,
# then the folders it leaves empty; prints how many files went and which could not, with why.
REMOVE = """
# Removal of the files SRC no longer has from DEST
import errno, json, os, stat, sys
def remove(top, name):
    *folders, leaf = name.split("/")
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for part in folders:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        if stat.S_ISDIR(os.stat(leaf, dir_fd=fds[-1], follow_symlinks=False).st_mode):
            return 0
        os.unlink(leaf, dir_fd=fds[-1])
        for part, fd in zip(reversed(folders), reversed(fds[:-1])):
            try:
                os.rmdir(part, dir_fd=fd)
            except OSError:
                break
        return 1
    finally:
        for fd in fds:
            os.close(fd)
removed, failed = 0, []
for name in sys.argv[2:]:
    try:
        removed += remove(sys.argv[1], name)
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            failed.append([name, err.strerror or str(err)])
print(json.dumps({"removed": removed, "failed": failed}))
"""


def remove_stale(session: Session, python: str, dest: str, names: tuple[str, ...], deadline: float) -> int:
    """Remove `names` under DEST on the host; how many files went. A name that is not there, or
    reached only through a link, is left alone; one that could not be removed is one error."""
    host = session.host.name
    removed, failed = 0, []
    for group in batches(names, ARGV_BUDGET):
        result = session.run([python, "-c", REMOVE, dest, *group], timeout=max(0.0, deadline - time.monotonic()))
        count, refused = removal_answer(host, result, group)
        removed, failed = removed + count, failed + refused
    if failed:
        raise MeshrunError(f"host '{host}': could not remove {len(failed)} files SRC no longer has from "
                           f"{shown_path(dest)}: {listing(failed)}; make them removable there (or remove them), "
                           "then sync again")
    return removed


def removal_answer(host: str, result: CommandResult, group: tuple[str, ...]) -> tuple[int, list[str]]:
    """(files removed, `name (why)` of each that could not be) from the host's answer: a count of at
    most the names asked, only the names asked for, the host's words quoted on one line."""
    reader = Answer(host, "the removal of files SRC no longer has")
    try:
        answer = result.last_json()
    except (ValueError, IndexError):
        why = result.stderr.strip()[-200:] or f"exit status {result.rc}"
        raise MeshrunError(f"host '{host}': could not remove files SRC no longer has: {said(why)}") from None
    answer = reader.mapping(answer)
    count = answer.get("removed", MISSING)
    if not (is_int(count) and 0 <= count <= len(group)):
        raise reader.bad("removed", count, f"a count from 0 to {len(group)}")
    asked = set(group)
    pairs = [p for p in reader.array(answer.get("failed", MISSING), "failed")
             if isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p)]
    return count, [f"{said(name, 80)} ({said(why, 80)})" for name, why in pairs if name in asked]
