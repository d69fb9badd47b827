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
  (torch requires every rank to create every group, in the same order), each with ``timeout``:
  ``new_group`` without one takes torch's default (30 min on gloo, 10 on NCCL), not the default
  group's, and nearly every collective of a hier run (DDP's all-reduce, the outer step, the
  evaluation's sums) runs on these groups: a stalled peer must be noticed after ``dist.timeout``.
  The result holds this rank's site group (DDP runs over it), the representatives' group (on
  representatives only) and the route DiLoCo's outer all-reduce takes (``train.diloco.Route``).
- ``Sites.single``: one site (one host, one ``torchrun --standalone``, or the survivors of an
  elastic run that lost every other site): hier is then plain DDP over it, no outer step
  (``DiLoCoSettings.single``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Sequence

import torch.distributed as torch_dist

from meshrun.layout import DEFAULT_PG_TIMEOUT_S
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

    @property
    def single(self) -> bool:
        return len(layout(self.keys)) == 1

    def describe(self) -> str:
        """``2 sites: office ranks [0, 1], home ranks [2]``."""
        sites = layout(self.keys)
        return f"{len(sites)} site{'s' if len(sites) != 1 else ''}: " + ", ".join(
            f"{dist._label(self.keys[ranks[0]])} ranks {list(ranks)}" for ranks in sites)  # another rank's words

    def announce(self, inner_steps: int, wire: str) -> str:
        """The trainer's line about the layout and what hier does with it; the ``;`` ends the
        layout for its readers (tests/test_comm_multihost.py follows the sites of an elastic run)."""
        if self.single:
            return (f"comm: hier: {self.describe()}; plain DDP over it, no outer step (the outer "
                    f"model follows the model every {inner_steps} steps, for a resume on more sites)")
        return (f"comm: hier: {self.describe()}; DDP inside each site, diloco-overlap between sites "
                f"every {inner_steps} steps (pseudo-gradient in {wire})")


def build(env: DistEnv, timeout: datetime.timedelta | None = None) -> Sites:
    """Collective; see the module docstring. ``timeout``: the trainer's ``dist.timeout``
    (None: the project's default, never torch's)."""
    timeout = datetime.timedelta(seconds=DEFAULT_PG_TIMEOUT_S) if timeout is None else timeout
    keys = tuple(str(k) for k in dist.all_gather_objects(site_key(env)))
    sites = layout(keys)
    mine: torch_dist.ProcessGroup | None = None
    for ranks in sites:  # every rank creates every group, in the same order
        group = torch_dist.new_group(ranks=list(ranks), timeout=timeout)
        if env.rank in ranks:
            mine = group
    leaders = [ranks[0] for ranks in sites]
    cross = torch_dist.new_group(ranks=leaders, timeout=timeout)
    own = next(ranks for ranks in sites if env.rank in ranks)
    assert mine is not None
    route = Route(site=mine, cross=cross if env.rank in leaders else None, root=own[0])
    return Sites(keys, own, mine, route)


__all__ = ["Sites", "build", "layout", "site_key"]
