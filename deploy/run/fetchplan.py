"""Which hosts' checkpoints a fetch brings home, and what `--prune` may remove.

The hosts of a run hold byte-identical copies of its checkpoints (docs/trainer.md), so bringing
each host's copy home sends the same bytes once per host over links that may be a home upload. A
fetch therefore brings every host's small files first, manifests included, and then the
checkpoints of the host whose manifest lists the newest step; then of another host only while it
lists a file (a name and its sha256) that is not home yet: where copies differ (a host that joined
an elastic run late lacks the older steps and `best.pt`; one that left early lacks the newest), or
the first one's copy failed its checksum or it stopped answering.

`--prune` removes what the hosts no longer keep: the checkpoints meshrun brought home earlier that
are older than every answering host's oldest listed step (`agreed_floor`: a host's lie can only
lower it, so remove less), only when every host of the run's latest attempt answered, each file
still as meshrun placed it (`prunable`: never a file you changed, never `best.pt`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from meshrun.layout import checkpoint_step


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


def prunable(placed: Mapping[str, str], present: Mapping[str, str], floor: int) -> list[str]:
    """Of the checkpoints meshrun placed (`placed`: name -> the sha256 it placed), those still so here
    (`present`: name -> sha256 now) whose step is older than `floor`: what --prune removes."""
    return sorted(name for name, digest in placed.items()
                  if present.get(name) == digest and (step := checkpoint_step(name)) is not None and step < floor)
