"""Host-side quick check of the synced code; stdlib only, run as `python -I -S -c <this file>`.

Reads the code sync's file list (NUL-separated paths relative to the workdir, the current
directory) on stdin and prints one sha256: over each listed path's type, permission bits, size and
modification time in seconds (a symlink by its target alone; a missing file counts as missing). The
controller computes the same digest over its own project with `digest` from this module, so the
rule is written once. Equal digests mean rsync's own quick check (size and mtime, `--archive`
keeping both) would send nothing. `-S` keeps site-packages' `.pth` files from running: a third
of the interpreter's start on a venv with torch (docs/performance.md: why it counts at 32 hosts).

It prints no digest either unless the workdir's record of the names the last code sync sent
(`common/layout.py` SHIPPED_LIST) lists exactly the names given: a file an earlier sync sent that the
project no longer has (a renamed module whose old copy would shadow the new one) is on the host until
a sync removes it, and no digest over the listed names alone would see it (deploy/edges/sync.py).

Given this project's id and the name of the workdir's owner mark (`common/layout.py`
WORKDIR_OWNER) as its arguments, it prints no digest unless the mark is this project's: a workdir
another project took, or one no sync of this version claimed yet, is then synced, and the sync's
own claim says whose it is (deploy/edges/sync.py). The mark is read, never run.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys

MARK_MAX = 200  # bytes of an owner mark read, on either side: meshrun's is under 100, and a host's is untrusted
NOT_OURS = "not this project's workdir"  # what is printed instead of a digest then (never one)
SHIPPED_LIST = ".meshrun-files"  # common/layout.py's name, kept here: this file travels alone (tests hold them equal)
RECORD_MAX = 64 << 20  # bytes of that record read: a bigger one means "sync this host"
NOT_LAST = "not the files the last sync sent"  # printed instead of a digest when the record differs or is not there
_SAFE = frozenset(range(0x20, 0x7F)) - {0x5C}  # bytes a record line holds as they are; any other is `\0ooo`
_ESCAPED = re.compile(rb"\\0([0-3][0-7][0-7])")  # one escaped byte of a record line


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


def record_line(name: bytes) -> bytes:
    """One name as a record line holds it: a printable ASCII byte as it is, any other byte (a newline,
    UTF-8) and a backslash as `\\0` and three octal digits, which the host's `printf %b` reads back."""
    return b"".join(bytes((c,)) if c in _SAFE else b"\\0%03o" % c for c in name)


def record_of(names: list[bytes]) -> bytes:
    """The record of a sync that sent `names`: one line each, sorted, no name twice."""
    return b"".join(line + b"\n" for line in sorted({record_line(n) for n in names}))


def recorded(data: bytes) -> set[bytes]:
    """The names a record lists (`record_of`, read back)."""
    return {_ESCAPED.sub(lambda m: bytes((int(m.group(1), 8),)), line) for line in data.split(b"\n") if line}


def is_last(names: list[bytes]) -> bool:
    """Whether this workdir's record (at most RECORD_MAX bytes of it, a regular file) lists exactly `names`."""
    try:
        fd = os.open(SHIPPED_LIST, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(RECORD_MAX + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return False
    return data is not None and len(data) <= RECORD_MAX and recorded(data) == set(names)


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


CONTENT = "--content"  # main's argument: the content digest (`fab join`'s question), not the quick one


def content_digest(root: bytes, names: list[bytes]) -> str:
    """sha256 over every listed path's type, exec bit and bytes (a link by its target): whether two trees
    hold the same code, whatever their times (a second clone, a file saved unchanged). Reads every file:
    for `fab join`'s one question to one member, never the sync's hint."""
    summed = hashlib.sha256()
    for name in names:
        path = os.path.join(root, name)
        summed.update(name + b"\0")
        try:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                summed.update(b"link " + os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                summed.update(b"file %d " % bool(info.st_mode & 0o111))
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        summed.update(block)
            else:
                summed.update(b"other %o" % stat.S_IFMT(info.st_mode))
        except OSError:
            summed.update(b"-")
        summed.update(b"\0")
    return summed.hexdigest()


def main() -> None:
    names = [n for n in sys.stdin.buffer.read().split(b"\0") if n]
    if sys.argv[1:] == [CONTENT]:
        print(content_digest(b".", names))
        return
    if len(sys.argv) == 3 and not is_ours(mark_line(sys.argv[2]), sys.argv[1]):
        print(NOT_OURS)
        return
    print(digest(b".", names) if is_last(names) else NOT_LAST)


if __name__ == "__main__":
    main()
