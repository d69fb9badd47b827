"""Which host's checkpoints a fetch brings home.

Every host of a run holds a complete, byte-identical copy of every checkpoint (docs/trainer.md),
so bringing each host's copy home sends the same bytes once per host over links that may be a
home upload. A fetch therefore brings every host's small files first, manifests included, and
then the checkpoints of one host: the one whose manifest lists the newest step. Only when that
host's copy fails its checksum, or it stops answering, is the next one tried, until no host left
claims a step newer than what is home and verified.

`--prune` removes what the hosts no longer keep: the checkpoints meshrun brought home earlier that
are older than the oldest step the hosts' manifests agree on (`agreed_floor`: a step two hosts list
with the same sha256, so one compromised host claiming newer steps cannot make home drop the honest
ones), each still as meshrun placed it (`prunable`: never a file you changed, never `best.pt`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshrun.layout import checkpoint_step


@dataclass(frozen=True)
class Claim:
    """What one host's manifest says it holds, and what of it is here already."""

    host: str
    newest: int  # the newest step its manifest lists; -1: none
    here: bool = False  # the local host whose run directory is this one: nothing to bring
    at_home: int = 0  # how many of its listed files an earlier fetch left under hosts/<host>/checkpoints/
    lists: int = 1  # how many files its manifest lists (only `best.pt`, early in a run: no step, still a holder)


def newest_listed(names: Sequence[str] | set[str] | dict[str, str]) -> int:
    """The newest step among checkpoint names (`best.pt` has none); -1 without one."""
    return max((s for s in map(checkpoint_step, names) if s is not None), default=-1)


def holder_order(claims: Sequence[Claim]) -> list[Claim]:
    """The hosts to take checkpoints from, in the order to try: the newest claim first; among
    equal claims, the local host's own folder (no transfer), then the host most of whose files an
    earlier fetch brought (rsync then sends only the new ones), then the run's host order.
    A host whose manifest lists nothing (none, or one refused whole) has nothing to offer."""
    return sorted((c for c in claims if c.lists > 0), key=lambda c: (-c.newest, not c.here, -c.at_home))


def worth_trying(claim: Claim, verified_home: int | None) -> bool:
    """Fetch this holder's checkpoints only if nothing came home verified yet (None), or it
    claims a step newer than the newest one a holder before it delivered and verified: the order
    is by claim, so once this is False, it is False for every holder after it too."""
    return verified_home is None or claim.newest > verified_home


def agreed_floor(manifests: Sequence[Mapping[str, str]]) -> int | None:
    """The oldest step the hosts' manifests (name -> sha256 each, as they answered) agree on: a
    step's file listed with the same sha256 by two of them, or by the only one that lists any
    (a run on one host); None when they agree on none (nothing is pruned then)."""
    listing = [m for m in manifests if m]
    need = min(2, len(listing))
    votes = Counter((name, digest) for m in listing for name, digest in m.items())
    steps = [checkpoint_step(name) for (name, _), count in votes.items() if need and count >= need]
    return min((s for s in steps if s is not None), default=None)


def prunable(placed: Mapping[str, str], present: Mapping[str, str], floor: int) -> list[str]:
    """Of the checkpoints meshrun placed (`placed`: name -> the sha256 it placed), those still so here
    (`present`: name -> sha256 now) whose step is older than `floor`: what --prune removes."""
    return sorted(name for name, digest in placed.items()
                  if present.get(name) == digest and (step := checkpoint_step(name)) is not None and step < floor)
