"""Files and paths a person or a host named, read by the controller: one line when they cannot be.

Every such file — the inventory, known_hosts, ssh_config, run records, a trainer config, the project's
requirements — is read with `meshrun.fsutil.read_regular`: a regular file only (a FIFO would hang the
controller, `/dev/zero` fill its memory), of a bounded size. A refusal names the file, what is wrong
and what to do (exit status 2). A path a flag names is looked at with `flag_path_stat`: a name the
system refuses (longer than 255 bytes, a loop of symlinks) is one line too, never an internal error.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from meshrun.fsutil import FileRefused, not_regular, read_regular, size_text
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import with_path

MISSING = (errno.ENOENT, errno.ENOTDIR)
# What each file may weigh: far above any real one, far below what would hurt the controller.
KNOWN_HOSTS_MAX = 16 << 20  # about 100 000 keys
SSH_CONFIG_MAX = 1 << 20
RECORD_MAX = 1 << 20  # launch.json, commplan.json, the pre-flight cache: a few kB each


def why(err: OSError) -> str:
    """What is wrong with a file, in words: `is a FIFO, not a regular file`, `does not exist`, ..."""
    if isinstance(err, FileRefused):
        return str(err)
    if err.errno in MISSING:
        return "does not exist"
    return f"cannot be read ({os.strerror(err.errno).lower() if err.errno else err.__class__.__name__})"


def read_input(path: Path, limit: int, what: str, fix: str) -> bytes:
    """The bytes of the file `what` (e.g. "known_hosts") at `path`, or InputError:
    `known_hosts /x/kh is a FIFO, not a regular file; <fix>`."""
    try:
        return read_regular(path, limit)
    except OSError as err:
        raise InputError(with_path(f"{what} ", path, f" {why(err)}; {fix}")) from None


def read_optional(path: Path, limit: int, what: str, fix: str) -> bytes | None:
    """As `read_input`, but None when nothing is there."""
    try:
        return read_regular(path, limit)
    except OSError as err:
        if err.errno in MISSING and not isinstance(err, FileRefused):
            return None
        raise InputError(with_path(f"{what} ", path, f" {why(err)}; {fix}")) from None


def flag_path_stat(flag: str, path: Path) -> os.stat_result | None:
    """What a flag's path is (followed through symlinks), None when nothing is there; InputError when
    the system refuses the name itself."""
    try:
        return path.stat()
    except OSError as err:
        if err.errno in MISSING:
            return None
        raise InputError(with_path(f"{flag} ", path, f": {os.strerror(err.errno or 0).lower()}; name another path")) \
            from None


def regular_file_problem(path: Path, limit: int) -> str | None:
    """Why `path` could not be read as an input file (`is a FIFO, not a regular file`, `is larger than
    16 MiB`), from its stat alone; None when it could, or when nothing is there."""
    try:
        found = os.stat(path)
    except OSError as err:
        return None if err.errno in MISSING else why(err)
    problem = not_regular(found.st_mode)
    if problem is None and found.st_size > limit:
        problem = f"is larger than {size_text(limit)}"
    return problem
