"""Which host's checkpoints a fetch brings home.

Every host of a run holds a complete, byte-identical copy of every checkpoint (docs/trainer.md),
so bringing each host's copy home sends the same bytes once per host over links that may be a
home upload. A fetch therefore brings every host's small files first, manifests included, and
then the checkpoints of one host: the one whose manifest lists the newest step. Only when that
host's copy fails its checksum, or it stops answering, is the next one tried, until no host left
claims a step newer than what is home and verified.
"""

from __future__ import annotations

from collections.abc import Sequence
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
