"""The sha256 of the controller's own copies under a run's home (`runs/<id>/`), remembered by what
`lstat` says of each file, as git's index remembers a worktree's.

A fetch compares what a host sent with the copy here (still the same bytes? still what meshrun put
there, or yours now?) and lists the assembled `checkpoints/` by their digests; without a memory,
every periodic fetch of a long run read every checkpoint here again, the steps an earlier fetch
brought included (`fetch-checkpoints` without `--prune` keeps them all): a run that saved a hundred
1 GB checkpoints read 100 GB at each fetch. A digest is remembered for a file of MEMO_MIN_BYTES or
more, keyed by its device, inode, size, modification and change times (nanoseconds), and only
when `lstat` says the same before and after it was read; it is used only while `lstat` still says
exactly that. Any write changes the change time, which no process can set (a `touch -d` back to the
old mtime, a rename, a chmod: all change it), so an edited file is read again; a file a host sent
is a new inode, placed by a rename here. The memory is this controller's own file,
`.placed/.digests.json` (a leading dot: never a host's record), in the home no host writes to; a
file that cannot be read as meshrun wrote it is no memory. One fetch at a time writes it
(`fetch_lock`); the hosts' threads of that fetch share it under a lock.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from meshrun.fsutil import FileRefused, atomic_write_json, read_regular, sha256_file
from meshrun.deploy.edges.placed import PLACED, PLACED_MAX

MEMO = ".digests.json"
MEMO_MIN_BYTES = 1 << 20  # smaller files cost less to read than to remember

StatKey = tuple[int, int, int, int, int]


def stat_key(path: Path) -> StatKey | None:
    """(device, inode, size, mtime ns, ctime ns) of a regular file (not followed), else None."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class Digests:
    """The sha256 of a file here, read each time it is asked for (`DigestMemo` remembers)."""

    def digest(self, path: Path) -> str:
        return sha256_file(path)

    def placed(self, path: Path, digest: str, staged: StatKey | None) -> None:
        """`path` was just renamed into place from a file whose `lstat` was `staged`, bytes `digest`."""


class DigestMemo(Digests):
    """The digests of `home`'s files, read once while they do not change; `save()` keeps them."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._entries = _load(home / PLACED / MEMO)
        self._lock = threading.Lock()

    def digest(self, path: Path) -> str:
        """`path`'s sha256: remembered while its `lstat` is unchanged, else read (and remembered)."""
        try:
            name = path.relative_to(self.home).as_posix()
        except ValueError:
            return sha256_file(path)
        before = stat_key(path)
        with self._lock:
            known = self._entries.get(name)
        if before is not None and known is not None and known[0] == before:
            return known[1]
        digest = sha256_file(path)
        if before is not None and before[2] >= MEMO_MIN_BYTES and stat_key(path) == before:
            with self._lock:
                self._entries[name] = (before, digest)
        return digest

    def placed(self, path: Path, digest: str, staged: StatKey | None) -> None:
        """Remember what place() just renamed here: its bytes are the staged file's, read as they were
        checked or copied, so it need not be read again. The rename changed its change time and
        nothing else; a write since (a process of yours, in between) would have changed its
        modification time too: then nothing is remembered."""
        now = stat_key(path)
        if staged is None or now is None or now[:4] != staged[:4] or now[2] < MEMO_MIN_BYTES:
            return
        try:
            name = path.relative_to(self.home).as_posix()
        except ValueError:
            return
        with self._lock:
            self._entries[name] = (now, digest)

    def save(self) -> None:
        """Keep what still holds (a file replaced or edited since it was read is dropped). Never
        fatal: a memory that cannot be written costs the next fetch its reading, nothing else."""
        with self._lock:
            entries = dict(self._entries)
        kept = {name: [list(key), digest] for name, (key, digest) in sorted(entries.items())
                if stat_key(self.home / name) == key}
        try:
            if not kept:  # nothing worth remembering: no file
                (self.home / PLACED / MEMO).unlink(missing_ok=True)
                return
            (self.home / PLACED).mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.home / PLACED / MEMO, kept)
        except OSError:
            pass


def _load(path: Path) -> dict[str, tuple[StatKey, str]]:
    try:
        data = json.loads(read_regular(path, PLACED_MAX))
    except (OSError, FileRefused, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    found: dict[str, tuple[StatKey, str]] = {}
    for name, entry in data.items():
        if (isinstance(name, str) and not name.startswith("/") and ".." not in name.split("/") and isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str)
                and len(entry[1]) == 64 and isinstance(entry[0], list) and len(entry[0]) == 5
                and all(type(n) is int for n in entry[0])):
            found[name] = (tuple(entry[0]), entry[1])  # type: ignore[assignment]
    return found
