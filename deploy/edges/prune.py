"""`fab fetch-checkpoints --prune`: the checkpoints fetched earlier that the hosts no longer keep,
removed from home (the rule is `deploy/run/fetchplan.agreed_floor` and `prunable`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR

from meshrun.layout import CHECKPOINTS, HOSTS
from meshrun.deploy.edges.fetch import FetchReport, read_host_manifest
from meshrun.deploy.edges.placed import hashes_of, read_placed, save_placed, write_assembled_manifest
from meshrun.deploy.run.fetchplan import agreed_floor, prunable


@dataclass
class Pruned:
    floor: int | None  # the oldest step every host keeps (agreed_floor); None: nothing pruned
    removed: list[str]  # relative to runs/<id>/
    silent: list[str] = dataclasses.field(default_factory=list)  # hosts of the run that did not answer

    def line(self) -> str:
        if self.silent:
            return f"prune: nothing removed: {', '.join(self.silent)} did not answer, and may keep older checkpoints"
        if self.floor is None:
            return "prune: no host lists a checkpoint: nothing removed"
        shown = ", ".join(self.removed[:6]) + (f" and {len(self.removed) - 6} more" if len(self.removed) > 6 else "")
        return (f"prune: removed {len(self.removed)} checkpoint file(s) older than step {self.floor}, which the hosts "
                f"no longer keep" + (f": {shown}" if self.removed else ""))


def prune_home(home: Path, reports: list[FetchReport], members: tuple[str, ...]) -> Pruned:
    """`--prune`: the checkpoints an earlier fetch brought that are older than `agreed_floor`, each
    still as meshrun placed it, go from the assembled `checkpoints/` (its manifest rewritten; not
    when it is a local host's own run folder) and from each host's tree (its `.placed` record too).
    Only through real folders: a folder on the way that is a link (yours) is passed over. Only
    when every host of the run's latest attempt answered: the floor is the oldest step any of
    them keeps, and a host that did not answer may keep older ones."""
    silent = [m for m in members if m not in {r.host for r in reports}]
    if silent:
        return Pruned(None, [], silent)
    floor = agreed_floor([r.claimed for r in reports])
    if floor is None:
        return Pruned(None, [])
    removed: list[str] = []
    target = home / CHECKPOINTS
    if not any(r.landed == home for r in reports) and _real_dirs(home, target):
        listed = read_host_manifest(target).digests()
        gone = _unlink(target, prunable(listed, hashes_of(target, listed), floor))
        if gone:
            write_assembled_manifest(target, {n: d for n, d in listed.items() if n not in gone}, FetchReport("", target))
        removed += [f"{CHECKPOINTS}/{name}" for name in gone]
    for report in (r for r in reports if r.landed != home):
        tree, prefix = report.landed / CHECKPOINTS, f"{CHECKPOINTS}/"
        if not _real_dirs(home, tree):
            continue
        record = read_placed(home, report.host)
        mine = {n.removeprefix(prefix): d for n, d in record.items() if n.startswith(prefix)}
        gone = _unlink(tree, prunable(mine, hashes_of(tree, mine), floor))
        if gone:
            save_placed(home, report.host, {n: d for n, d in record.items() if n.removeprefix(prefix) not in gone})
        removed += [f"{HOSTS}/{report.host}/{CHECKPOINTS}/{name}" for name in gone]
    return Pruned(floor, removed)


def _real_dirs(home: Path, folder: Path) -> bool:
    """Every folder from `home` down to `folder` is a real folder, none a link."""
    try:
        return all(S_ISDIR(os.lstat(d).st_mode) for d in [folder, *folder.parents] if d == home or d.is_relative_to(home))
    except OSError:
        return False


def _unlink(folder: Path, names: list[str]) -> list[str]:
    gone = []
    for name in names:
        try:
            (folder / name).unlink()
            gone.append(name)
        except FileNotFoundError:
            pass
    return gone
