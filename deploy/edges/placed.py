"""What each fetch placed under `runs/<id>/hosts/<host>/`, kept apart from the host's tree.

`.placed/<host>.json` records {relative name: sha256} of what the last fetch placed there, so the
next fetch may replace a file still so (a log that grew, a `best.pt` the host rewrote) and never
one you changed; `.placed/<host>.jsonl` journals each file as it is placed, so a fetch cut off
midway still vouches for what it moved (`.placed/.checkpoints.jsonl` does the same for the
assembled `checkpoints/`, until its manifest is written).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from stat import S_ISDIR

from meshrun.fsutil import FileRefused, atomic_write_bytes, atomic_write_json, read_regular, sha256_file
from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.staging import is_regular
from meshrun.deploy.run.manifest import manifest_text

PLACED = ".placed"  # per host, what the last fetch placed under hosts/<host>/ (read_placed)
PLACED_MAX = 64 << 20  # a record of every file of a host's run folder: a sha256 and a name each


def read_placed(home: Path, host: str) -> dict[str, str]:
    """What an earlier fetch placed under `hosts/<host>/` ({relative name: sha256}): a file still
    so is meshrun's, and the next fetch may replace it (a host's manifest, `best.pt`, a pruned
    log); one that differs is yours. Kept apart from the host's tree, which the host fills, so a
    host cannot vouch for a file itself. Missing or unreadable: nothing vouched for. The journal
    of a fetch cut off while placing (`journal_to`) counts too: its files are meshrun's as well."""
    try:
        data = json.loads(read_regular(home / PLACED / f"{host}.json", PLACED_MAX))
    except (OSError, FileRefused, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    record = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}
    return {**record, **read_journal(home, host)}


def _journal(home: Path, key: str) -> Path:
    return home / PLACED / f"{key}.jsonl"


def drop_journal(home: Path, key: str) -> None:
    """A journal goes once what it held is recorded (the host's record, or the assembled manifest)."""
    _journal(home, key).unlink(missing_ok=True)


def journal_to(home: Path, key: str) -> Callable[[str, str], None]:
    """One line, `[name, sha256]`, per file as place() puts it here. The record is saved once the
    whole host is placed; a fetch cut off before (Ctrl-C, a closed terminal: the worker threads
    die mid-place) would leave the files it moved in vouched for by nobody, and the next fetch
    would call them yours. Not fsynced: it outlives the process, which is what is cut here."""
    path = _journal(home, key)
    path.parent.mkdir(parents=True, exist_ok=True)

    def add(name: str, digest: str) -> None:
        with open(path, "a", encoding="ascii") as handle:  # json.dumps escapes any other character
            handle.write(json.dumps([name, digest]) + "\n")
    return add


def read_journal(home: Path, key: str) -> dict[str, str]:
    """A journal's entries, the later line winning; a line cut mid-write, or not meshrun's form, is skipped."""
    try:
        data = read_regular(_journal(home, key), PLACED_MAX)
    except (OSError, FileRefused):
        return {}
    found: dict[str, str] = {}
    for line in data.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry) \
                and len(entry[1]) == 64:
            found[entry[0]] = entry[1]
    return found


def placed_after(ours: Mapping[str, str], report: FetchReport) -> dict[str, str]:
    """The record once this fetch is placed: what it placed, and what an earlier one placed that
    this one did not bring (the host pruned it) while its file is still here. A file you changed
    keeps the entry of what meshrun placed, which no longer matches it: it stays yours."""
    merged = {**ours, **report.placed}
    return {name: digest for name, digest in merged.items()
            if name in report.placed or os.path.lexists(report.landed / name)}


def save_placed(home: Path, host: str, placed: Mapping[str, str]) -> None:
    """The record, atomically; then its journal goes (what it held, `placed` holds)."""
    (home / PLACED).mkdir(parents=True, exist_ok=True)
    atomic_write_json(home / PLACED / f"{host}.json", dict(placed))
    drop_journal(home, host)


def hashes_of(directory: Path, names: Iterable[str], digest: Callable[[Path], str] = sha256_file) -> dict[str, str]:
    """{name: sha256} of the regular files of `directory` among `names` (links not followed)."""
    return {name: digest(directory / name) for name in sorted(names) if is_regular(directory / name)}


def write_assembled_manifest(directory: Path, entries: dict[str, str], report: FetchReport) -> None:
    """Write the assembled manifest atomically (never through a link, as os.replace swaps the
    name itself), unless the folder is not a real one (place said so) or the manifest's name is
    a folder or link of yours (a conflict, as place would call it)."""
    try:
        if not S_ISDIR(os.lstat(directory).st_mode):
            return
    except FileNotFoundError:
        return  # nothing was placed
    path, text = directory / CHECKPOINT_MANIFEST, manifest_text(entries).encode()
    if os.path.lexists(path) and not is_regular(path):
        report.conflicts.append(f"{CHECKPOINTS}/{CHECKPOINT_MANIFEST}")
    elif not is_regular(path) or os.lstat(path).st_size != len(text) or path.read_bytes() != text:
        atomic_write_bytes(path, text)
