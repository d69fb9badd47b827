"""Sites for ``comm.hook=hier``: which ranks share a place, and torch process groups over them.

Contract:
- A rank's site key is ``MESHRUN_SITE`` (the inventory's ``site:``, docs/sites.md), else
  ``host:<MESHRUN_HOST>``: a host with no declared site is a place of its own (a declared name has
  no ``:``, so the two never meet). Under one ``torchrun --standalone`` every rank has the same key.
- ``layout(keys)`` (pure): the sites in order of their lowest rank, each the tuple of its ranks;
  a site's representative is its lowest rank.
- ``build(env)`` (collective): all-gathers every rank's key (tensor collectives read back
  like checkpoints, ``train.dist.all_gather_objects``), then every rank calls
  ``torch.distributed.new_group`` for every site and then for the representatives, in that order
  (torch requires every rank to create every group, in the same order). The result holds this
  rank's site group (DDP runs over it), the representatives' group (on representatives only)
  and the route DiLoCo's outer all-reduce takes (``train.diloco.Route``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch.distributed as torch_dist

from meshrun.train import dist
from meshrun.train.diloco import Route
from meshrun.train.dist import DistEnv


def site_key(env: DistEnv) -> str:
    return env.site or f"host:{env.host}"


def layout(keys: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Ranks per site, sites ordered by their lowest rank: ``["a", "b", "a"]`` → ``((0, 2), (1,))``."""
    sites: dict[str, list[int]] = {}
    for rank, key in enumerate(keys):
        sites.setdefault(key, []).append(rank)
    return tuple(tuple(ranks) for ranks in sites.values())


@dataclass(frozen=True)
class Sites:
    keys: tuple[str, ...]  # per rank
    ranks: tuple[int, ...]  # this rank's site
    group: torch_dist.ProcessGroup  # DDP's process group: this rank's site
    route: Route  # DiLoCo's outer all-reduce: in the site, across representatives, back

    def describe(self) -> str:
        """``2 sites: office ranks [0, 1], home ranks [2]``."""
        sites = layout(self.keys)
        return f"{len(sites)} site{'s' if len(sites) != 1 else ''}: " + ", ".join(
            f"{self.keys[ranks[0]]} ranks {list(ranks)}" for ranks in sites)


def build(env: DistEnv) -> Sites:
    """Collective; see the module docstring."""
    keys = tuple(str(k) for k in dist.all_gather_objects(site_key(env)))
    sites = layout(keys)
    mine: torch_dist.ProcessGroup | None = None
    for ranks in sites:  # every rank creates every group, in the same order
        group = torch_dist.new_group(ranks=list(ranks))
        if env.rank in ranks:
            mine = group
    leaders = [ranks[0] for ranks in sites]
    cross = torch_dist.new_group(ranks=leaders)
    own = next(ranks for ranks in sites if env.rank in ranks)
    assert mine is not None
    route = Route(site=mine, cross=cross if env.rank in leaders else None, root=own[0])
    return Sites(keys, own, mine, route)


__all__ = ["Sites", "build", "layout", "site_key"]
