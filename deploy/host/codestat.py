"""Host-side quick check of the synced code; stdlib only, run as `python -I -S -c <this file>`.

Reads the code sync's file list (NUL-separated paths relative to the workdir, the current
directory) on stdin and prints one sha256: over each listed path's type, permission bits, size and
modification time in seconds (a symlink by its target alone; a missing file counts as missing). The
controller computes the same digest over its own project with `digest` from this module, so the
rule is written once. Equal digests mean rsync's own quick check (size and mtime, `--archive`
keeping both) would send nothing. `-S` keeps site-packages' `.pth` files from running: a third
of the interpreter's start on a venv with torch (docs/performance.md: why it counts at 32 hosts).

Given this project's id and the name of the workdir's owner mark (`common/layout.py`
WORKDIR_OWNER) as its arguments, it prints no digest unless the mark is this project's: a workdir
another project took, or one no sync of this version claimed yet, is then synced, and the sync's
own claim says whose it is (deploy/edges/sync.py). The mark is read, never run.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys

MARK_MAX = 200  # bytes of an owner mark read, on either side: meshrun's is under 100, and a host's is untrusted
NOT_OURS = "not this project's workdir"  # what is printed instead of a digest then (never one)


def describe(root: bytes, name: bytes) -> bytes:
    """One path's record: what rsync's quick check and `--archive` compare, and nothing else (not
    the owner: a host's user need not be the controller's)."""
    path = os.path.join(root, name)
    try:
        info = os.lstat(path)
    except OSError:
        return b"-"
    if stat.S_ISLNK(info.st_mode):  # rsync compares a link by its target: its time is not always kept
        try:
            return b"link " + os.readlink(path)
        except OSError:
            return b"-"
    # Whole seconds, as rsync compares times by default (`--modify-window=0`): a finer time here
    # would tell a copy from its original forever, since rsync never sends a file to mend it.
    seconds = info.st_mtime_ns // 1_000_000_000
    return b"%o %o %d %d" % (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_size, seconds)


def digest(root: bytes, names: list[bytes]) -> str:
    """sha256 over every listed path and its record, in the order given."""
    summed = hashlib.sha256()
    for name in names:
        summed.update(name + b"\0" + describe(root, name) + b"\0")
    return summed.hexdigest()


def mark_line(path: str | bytes) -> bytes | None:
    """The first line of an owner mark (at most MARK_MAX bytes of it, never run or parsed further);
    None when there is none, b"" when it is not a regular file or cannot be read (no project's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO there must not block
    except FileNotFoundError:
        return None if not os.path.islink(path) else b""  # a dangling link: there, but no project's
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, MARK_MAX).split(b"\n", 1)[0]
    except OSError:
        return b""
    finally:
        os.close(fd)


def is_ours(line: bytes | None, project_id: str) -> bool:
    """Whether a mark's first line names this project: its id, alone or before the project's name."""
    ours = project_id.encode()
    return line is not None and (line == ours or line.startswith(ours + b" "))


def main() -> None:
    names = [n for n in sys.stdin.buffer.read().split(b"\0") if n]
    if len(sys.argv) == 3 and not is_ours(mark_line(sys.argv[2]), sys.argv[1]):
        print(NOT_OURS)
        return
    print(digest(b".", names))


if __name__ == "__main__":
    main()
