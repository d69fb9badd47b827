"""Temp files that checkpoint saves killed outright left in a checkpoint directory.

A save writes a temp file beside its target and renames it (`meshrun.fsutil`); a SIGKILL (the
agent's `restart` after a peer is lost, torchrun stopping a worker group, `fab stop`'s last resort)
skips the `finally` that removes it, so every save a restart cut left a checkpoint-sized file for
the rest of the run, which every fetch brought home again. A directory's elected writer removes
them as it opens the directory: it is the only process of the run that writes there
(`train/checkpoint.open_site`), and torchrun stops a group's workers before the rendezvous of the
next group, so a temp found then belongs to a writer that is gone. Only the names `fsutil` gives
the trainer's own files (checkpoints, `best.pt`, the manifest) go, never another file, and never
one whose pid is a live process on this host: two runs sharing a directory by mistake (two bare
`python -m meshrun.train` in `runs/local`) must not cut each other's saves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

from meshrun.fsutil import TMP_NAME
from meshrun.layout import CHECKPOINT_MANIFEST, is_checkpoint_name


def stale_temps(names: Iterable[str], alive: Callable[[int], bool]) -> list[str]:
    """Of a directory's file names, the trainer's own temp files whose writer (the pid in the name)
    is not `alive`, sorted."""
    found = []
    for name in names:
        match = TMP_NAME.fullmatch(name)
        if match is None:
            continue
        target, pid = match.group(1), int(match.group(2))
        if (is_checkpoint_name(target) or target == CHECKPOINT_MANIFEST) and not alive(pid):
            found.append(name)
    return sorted(found)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (this one included)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False  # no writer has it; os.kill would signal a process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    except (OverflowError, OSError):
        return False  # a number no process can have
    return True


def remove_stale_temps(directory: Path, alive: Callable[[int], bool] = pid_alive) -> list[str]:
    """Remove `stale_temps` from `directory` (missing: nothing to do); the names removed. A name
    that cannot be removed (a folder under that name, gone meanwhile) is left as it is."""
    try:
        names = [entry.name for entry in os.scandir(directory)]
    except FileNotFoundError:
        return []
    removed = []
    for name in stale_temps(names, alive):
        try:
            os.unlink(directory / name)  # a link is removed itself, never what it points to
        except OSError:
            continue
        removed.append(name)
    return removed
