"""Which hosts' checkpoints a fetch brings home, and what `--prune` may remove.

The hosts of a run hold byte-identical copies of its checkpoints (docs/trainer.md), so bringing
each host's copy home sends the same bytes once per host over links that may be a home upload. A
fetch therefore brings every host's small files first, manifests included, and then the
checkpoints of the host whose manifest lists the newest step; then of another host only while it
lists a file (a name and its sha256) that is not home yet: where copies differ (a host that joined
an elastic run late lacks the older steps and `best.pt`; one that left early lacks the newest), or
the first one's copy failed its checksum or it stopped answering.

`--prune` removes what the hosts still in the run no longer keep (`prune_rule`): the checkpoints
meshrun brought home earlier that are older than the oldest step listed by the hosts that answered
this fetch and are still in the run: members of its latest attempt that did not leave it while it
went on (`departed`, from the run's events). A host that left on day 2 of a week no longer holds
every later checkpoint home, and is not waited for; a member still in the run that does not answer
removes nothing (it may keep older checkpoints, and an answering host's lie must not be the only
word). Never a file an answering
host lists (a host that left keeps its last few: home keeps them too, and no fetch brings them
again), never the newest checkpoint home, each file still as meshrun placed it (`prunable`: never
a file you changed, never `best.pt`). A host's lie lowers the step (`agreed_floor`) or keeps
more, unless every other member left the run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from meshrun.layout import checkpoint_step
from meshrun.deploy.run.answers import is_int
from meshrun.deploy.run.membership import Change


@dataclass(frozen=True)
class Claim:
    """What one host's manifest says it holds, and what of it is here already."""

    host: str
    listed: Mapping[str, str] = field(default_factory=dict)  # its manifest: name -> sha256, as it answered
    here: bool = False  # the local host whose run directory is this one: nothing to bring
    at_home: int = 0  # how many of its listed files an earlier fetch left under hosts/<host>/checkpoints/

    @property
    def newest(self) -> int:
        return newest_listed(self.listed)


def newest_listed(names: Collection[str]) -> int:
    """The newest step among checkpoint names (`best.pt` has none); -1 without one."""
    return max((s for s in map(checkpoint_step, names) if s is not None), default=-1)


def holder_order(claims: Sequence[Claim]) -> list[Claim]:
    """The hosts to take checkpoints from, in the order to try: the newest claim first; among
    equal claims, the local host's own folder (no transfer), then the host most of whose files an
    earlier fetch brought (rsync then sends only the new ones), then the run's host order.
    A host whose manifest lists nothing (none, or one refused whole) has nothing to offer."""
    return sorted((c for c in claims if c.listed), key=lambda c: (-c.newest, not c.here, -c.at_home))


def worth_trying(claim: Claim, home: Collection[tuple[str, str]]) -> bool:
    """Fetch this holder's checkpoints only if its manifest lists a file, by name and sha256, that
    is not home (`home`: the pairs here as meshrun placed them, or verified from a holder before)."""
    return any((name, digest) not in home for name, digest in claim.listed.items())


def agreed_floor(manifests: Sequence[Mapping[str, str]]) -> int | None:
    """The oldest step every host still keeps: the smallest of each answering host's oldest listed
    step (a host listing none is left out). A host's lie can only lower it (it lists an older step)
    or not move it (it lists only newer ones: the others' oldest stands). None: no host lists one."""
    oldest = [min(steps) for m in manifests if (steps := [s for s in map(checkpoint_step, m) if s is not None])]
    return min(oldest, default=None)


def prunable(placed: Mapping[str, str], present: Mapping[str, str], floor: int,
             kept: Collection[str] = frozenset()) -> list[str]:
    """Of the checkpoints meshrun placed (`placed`: name -> the sha256 it placed), those still so here
    (`present`: name -> sha256 now) whose step is older than `floor` and that no answering host
    lists (`kept`): what --prune removes."""
    return sorted(name for name, digest in placed.items() if present.get(name) == digest and name not in kept
                  and (step := checkpoint_step(name)) is not None and step < floor)


# How a host's part in the run ended, in the controller's events file (deploy/edges/launcher.py).
_IN = {Change.STARTED.value, Change.JOINED.value, Change.FINISHED.value}
_OUT = {Change.LEFT.value, Change.LOST.value}


def departed(events: Iterable[object]) -> frozenset[str]:
    """The hosts that left the run while it went on: those whose last membership event (the lines
    of the attached controller's `events.jsonl`, oldest first, each as JSON) is `left` or `lost`
    with processes still in the job after it (`world_size` > 0). One that started, joined or came
    back since is in it; one that ended with the run (nothing left in the job) did not leave it.
    A line of another shape is passed over: anyone with the folder may edit the file, and a host
    it misses counts as still in the run, which only removes less. A detached run has no such
    file: its hosts all count."""
    out: dict[str, bool] = {}
    for raw in events:
        if isinstance(raw, dict) and isinstance(host := raw.get("host"), str) and raw.get("event") in _IN | _OUT:
            size = raw.get("world_size")
            out[host] = raw["event"] in _OUT and is_int(size) and size > 0
    return frozenset(host for host, gone in out.items() if gone)


@dataclass(frozen=True)
class PruneRule:
    floor: int | None  # checkpoints older than this step may go; None: none may
    kept: frozenset[str]  # every name an answering host lists: never removed
    counted: tuple[str, ...]  # the hosts whose oldest step set the floor
    silent: tuple[str, ...] = ()  # members still in the run that did not answer: nothing may go


def prune_rule(answered: Mapping[str, Mapping[str, str]], members: Sequence[str], gone: Collection[str],
               newest_home: int) -> PruneRule:
    """What `--prune` may remove, from the manifests of the hosts that answered this fetch
    (`answered`: host -> its manifest). The floor is `agreed_floor` of the members of the run's
    latest attempt among them that did not leave it (`gone`: `departed`); where every answering
    member left (a run that ended with each of them lost), of them all. A host of an earlier
    attempt, or one that left, sets no floor: a host that left on day 2 would keep every later
    checkpoint home for the rest of the week. A member still in the run that did not answer
    (`silent`) removes nothing: it may keep older checkpoints than the others list, and an
    answering host that lies about what it keeps must not be the only word. The floor is at most the
    newest step home (`newest_home`; -1, none: nothing removed): the checkpoint a resume pushes is
    never removed, even when the one member that answered lists newer steps than came home."""
    mine = [host for host in answered if host in members]
    counted = tuple(host for host in mine if host not in gone) or tuple(mine)
    silent = tuple(host for host in members if host not in answered and host not in gone)
    floor = None if silent else agreed_floor([answered[host] for host in counted])
    kept = frozenset(name for listed in answered.values() for name in listed)
    return PruneRule(None if floor is None or newest_home < 0 else min(floor, newest_home), kept, counted, silent)
