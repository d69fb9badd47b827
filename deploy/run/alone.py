"""Which ranks of a --script run trained alone, read from the hosts' logs: summary.json's
`trained_alone` and the line the run ends with.

A rank of a world larger than one that exits 0 without calling `init_process_group` trained the
whole job by itself (a script written for `mp.spawn`, run without its distribution flags): its
exit status says success, and only its runner's ALONE_LINE, somewhere in its host's log, says
otherwise (deploy/host/alonewatch.py). The controller keeps every line a host streamed in
`runs/<id>/logs/<host>.log`; the line comes at the rank's end, so the last ALONE_READ bytes of each
log are read. The log is the host's word about its own ranks only: a line counts for the host whose
log holds it, whatever host its `[host:rank]` prefix names, and a host's claims cannot name more
ranks than ALONE_MAX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from meshrun.layout import ALONE_LINE

ALONE_READ = 256 << 10  # bytes of each host's log read from its end
ALONE_MAX = 4096  # ranks one host's log may name: more is a host flooding its log, not a world
_NUMBER = "([0-9]{1,7})"  # ASCII digits, as the runner formats them (`\d` takes other scripts' digits)
# The runner's line after torchrun's `[host:rank] ` prefix, as the whole of a log line.
_PATTERN = re.compile(r"\[[^\]\n]{1,300}\] " + re.escape(ALONE_LINE).replace(r"\{rank\}", _NUMBER)
                      .replace(r"\{world\}", _NUMBER), re.ASCII)


@dataclass(frozen=True, order=True)
class AloneRank:
    host: str  # the host whose log holds the line
    rank: int
    world_size: int


def alone_in_log(host: str, text: str) -> list[AloneRank]:
    """The ranks whose ALONE_LINE is a whole line of `text` (a log's end: its first line may be a
    part, which is no whole line then, and a rank repeated, once), rank below its world size."""
    found: set[AloneRank] = set()
    for line in text.splitlines():
        match = _PATTERN.fullmatch(line) if "trained alone" in line else None
        if match is None:
            continue
        rank, world = int(match.group(1)), int(match.group(2))
        if rank < world:
            found.add(AloneRank(host, rank, world))
        if len(found) >= ALONE_MAX:
            break
    return sorted(found)


def trained_alone(logs: Mapping[str, str]) -> list[AloneRank]:
    """Every host's alone ranks ({host: its log's end}), host by host, rank by rank."""
    return sorted(rank for host, text in logs.items() for rank in alone_in_log(host, text))


def alone_warning(ranks: Iterable[AloneRank]) -> str | None:
    """The line the run ends with where ranks trained alone; None where none did."""
    ranks = list(ranks)
    if not ranks:
        return None
    shown = ", ".join(f"{r.host} rank {r.rank}" for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return (f"{len(ranks)} rank(s) never called torch.distributed.init_process_group and trained alone ({shown}): each "
            "trained the whole job by itself, so the run's result is no distributed one; pass your script its "
            'distribution flags (docs/scripts.md, "Scripts written for mp.spawn")')
