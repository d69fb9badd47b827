"""`fab fetch-checkpoints --prune`: the checkpoints fetched earlier that the hosts still in the run no
longer keep, removed from home (the rule is `deploy/run/fetchplan.prune_rule`, `departed` and
`prunable`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR

from meshrun.layout import CHECKPOINTS, EVENTS, HOSTS
from meshrun.deploy.edges.fetch import FetchReport, read_host_manifest
from meshrun.deploy.edges.placed import hashes_of, read_placed, save_placed, write_assembled_manifest
from meshrun.deploy.edges.watch import tail
from meshrun.deploy.run.answers import from_json
from meshrun.deploy.run.fetchplan import departed, newest_listed, prunable, prune_rule

# Of the run's events file, the tail read: it grows by a line per membership change only (a few
# per host, MAX_REJOINS), and a host whose last line this misses counts as in the run (removes less).
EVENTS_READ = 256 << 10


@dataclass
class Pruned:
    floor: int | None  # the step below which checkpoints went (fetchplan.prune_rule); None: nothing pruned
    removed: list[str]  # relative to runs/<id>/
    aside: list[str] = dataclasses.field(default_factory=list)  # hosts that set no floor, each with why

    silent: list[str] = dataclasses.field(default_factory=list)  # members still in the run that did not answer

    def line(self) -> str:
        if self.silent:
            return f"prune: nothing removed: {', '.join(self.silent)} did not answer, and may keep older checkpoints"
        aside = f"; not counted: {', '.join(self.aside)}" if self.aside else ""
        if self.floor is None:
            return f"prune: nothing removed: no answering host still in the run lists a checkpoint, or none is home{aside}"
        shown = ", ".join(self.removed[:6]) + (f" and {len(self.removed) - 6} more" if len(self.removed) > 6 else "")
        return (f"prune: removed {len(self.removed)} checkpoint file(s) older than step {self.floor}, which the hosts "
                f"no longer keep" + (f": {shown}" if self.removed else "") + aside)


def prune_home(home: Path, reports: list[FetchReport], members: tuple[str, ...], events: Path | None = None) -> Pruned:
    """`--prune`: the checkpoints an earlier fetch brought that `prune_rule` lets go, each still as
    meshrun placed it, go from the assembled `checkpoints/` (its manifest rewritten; not when it is
    a local host's own run folder) and from each host's tree (its `.placed` record too). Only
    through real folders: a folder on the way that is a link (yours) is passed over. The hosts
    that left come from the run's `events` file (`home`'s own by default: the attached
    controller's); one that left sets no floor and is named; a member still in the run that did not
    answer removes nothing (`prune_rule`)."""
    answered = {r.host: r.claimed for r in reports}
    gone = departed(from_json(line) for line in tail(home / EVENTS if events is None else events,
                                                     EVENTS_READ).splitlines())
    target = home / CHECKPOINTS
    listed = read_host_manifest(target).digests()
    rule = prune_rule(answered, members, gone, newest_listed(listed))
    aside = [f"{h} (left the run, did not answer)" for h in members if h not in answered and h in gone] + [
        f"{h} ({'left the run' if h in members else 'not in its latest attempt'}: what it lists is kept)"
        for h in answered if h not in rule.counted]
    if rule.floor is None:
        return Pruned(None, [], aside, list(rule.silent))
    removed: list[str] = []
    if not any(r.landed == home for r in reports) and _real_dirs(home, target):
        gone_here = _unlink(target, prunable(listed, hashes_of(target, listed), rule.floor, rule.kept))
        if gone_here:
            write_assembled_manifest(target, {n: d for n, d in listed.items() if n not in gone_here},
                                     FetchReport("", target))
        removed += [f"{CHECKPOINTS}/{name}" for name in gone_here]
    for report in (r for r in reports if r.landed != home):
        removed += _prune_tree(home, report, rule.floor, rule.kept)
    return Pruned(rule.floor, removed, aside)


def _prune_tree(home: Path, report: FetchReport, floor: int, kept: frozenset[str]) -> list[str]:
    """One host's tree here: what `prunable` lets go of what meshrun placed in its `checkpoints/`."""
    tree, prefix = report.landed / CHECKPOINTS, f"{CHECKPOINTS}/"
    if not _real_dirs(home, tree):
        return []
    record = read_placed(home, report.host)
    mine = {n.removeprefix(prefix): d for n, d in record.items() if n.startswith(prefix)}
    gone = _unlink(tree, prunable(mine, hashes_of(tree, mine), floor, kept))
    if gone:
        save_placed(home, report.host, {n: d for n, d in record.items() if n.removeprefix(prefix) not in gone})
    return [f"{HOSTS}/{report.host}/{CHECKPOINTS}/{name}" for name in gone]


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
