"""`fab sync --data`: files a previous sync put at DEST that SRC no longer has are removed there,
so that an ImageFolder or a glob on the host stops training on images the researcher deleted.

What meshrun put at DEST is what its manifest there (`.meshrun-manifest.sha256`) lists. Before
the new transfer overwrites it, the old one is fetched with rsync (the same transport as the data,
and no cap on its size but MANIFEST_MAX) into the controller's private staging folder. The names
it lists that the new manifest lacks and that do not lexist in SRC (deploy/run/dataplan.py) are
then removed on the host by a short script over the session: component by component under DEST,
never through a link (O_NOFOLLOW), and each folder the removal leaves empty goes too (an empty
class folder is an ImageFolder error). Anything else at DEST stays: the host's own files, a
`.venv`, another sync's `.meshrun-partial/`.

It runs before the transfer: a removal that fails leaves the old manifest in place, so the next
sync still knows what to remove. Every name comes from the host, so none is ever sent anywhere.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sync import PROTECT_ARGS, remote_path, remote_spec, ssh_argv
from meshrun.deploy.edges.transport import CommandResult, Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.shown import listing, shown_path
from meshrun.deploy.run.answers import MISSING, Answer, is_int, said
from meshrun.deploy.run.dataplan import DATA_MANIFEST, batches, manifest_names, network_hint
from meshrun.deploy.run.shell import local_workdir
from meshrun.fsutil import read_regular

MANIFEST_MAX = 256 << 20  # about two million names; a larger old manifest is not read, and nothing is removed
ARGV_BUDGET = 64 << 10  # bytes of quoted names per removal command: `sh -c` takes one argument of 128 KiB
# rsync: 23, the file could not be read (no DEST yet, a first sync); 24, it vanished while read.
NOT_THERE_EXITS = (0, 23, 24)


def dest_path(host: Host, dest: str, root: Path) -> str:
    """DEST as rsync reaches it: a path here for a local host, `HOST:PATH` (relative to the login
    home) for a remote one."""
    if host.is_local:
        return dest if dest.startswith("/") else str(local_workdir(host.workdir, root) / dest)
    return remote_spec(host.ssh_host, dest if dest.startswith("/") else f"{remote_path(host.workdir)}/{dest}")


def fetch_manifest_argv(host: Host, dest: str, root: Path, known_hosts: Path | None, into: Path) -> list[str]:
    """DEST's manifest into the folder `into`: without --archive, a link in its place is skipped
    (not followed), and one larger than MANIFEST_MAX is not taken."""
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), f"--max-size={MANIFEST_MAX}"]
    if not host.is_local:
        argv += ["-e", shlex.join(ssh_argv(host, known_hosts))]
    return argv + [f"{dest_path(host, dest, root)}/{DATA_MANIFEST}", f"{into}/"]


def previous_names(host: Host, dest: str, root: Path, known_hosts: Path | None, into: Path,
                   deadline: float) -> list[str]:
    """The removable names of the manifest the previous sync left at DEST; none when it has none."""
    into.mkdir(mode=0o700)
    run_rsync(fetch_manifest_argv(host, dest, root, known_hosts, into), host=host.name, what="data sync",
              timeout=max(0.0, deadline - time.monotonic()), hint=network_hint(host.name), success=NOT_THERE_EXITS)
    try:
        return manifest_names(read_regular(into / DATA_MANIFEST, MANIFEST_MAX))
    except OSError:  # not there, not a file, or over the limit: nothing is known to be meshrun's
        return []


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
