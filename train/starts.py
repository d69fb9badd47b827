"""How many times this launch's worker group has started: `restarts` in summary.json is that
count minus one.

torchrun's `TORCHELASTIC_RESTART_COUNT` counts only the restarts that one agent made after a
worker failed; a membership change (a host lost or joining) restarts the whole group without
counting, so it under-reports. Instead, at every start the lowest rank on each host records the
start in `<run dir>/starts.json`, keyed by the rendezvous id (one launch; `fab train --resume`
gets a fresh id and counts afresh). The group agrees on the maximum across hosts — a host that
joined late has seen fewer starts — so the count survives the loss of any host. Outside torchrun
(no rendezvous id) nothing restarts the process: each invocation is its own launch, started once,
and nothing is recorded (a shared "" key would count every bare run in the run dir as a restart).

A count is bookkeeping and never stops training: a peer's gathered count is that host's word (a
compromised host sends any int64), and a recorded file may hold what such a peer once made this
host write, so a count out of range is ignored wherever it comes from (`STARTS_LIMIT`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from meshrun.fsutil import atomic_write_json
from meshrun.layout import STARTS_FILE
from meshrun.train import dist


# No real launch starts 2**31 times (one start a second for 68 years), and 2**31 is the bound the
# controller puts on the counts it reads (deploy/run/summary.py). Far inside int64, so an own count
# always fits the tensor `dist.all_gather_ints` builds: 2**63, made from a peer's 2**63-1 and
# written back, overflowed it at the next start and failed every rank of the group.
STARTS_LIMIT = 2**31


def sane_count(value: object) -> bool:
    """A start count this module believes: an int (not a bool) in [0, STARTS_LIMIT)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < STARTS_LIMIT


def read_starts(path: Path) -> dict[str, int]:
    """The recorded starts per rendezvous id; a missing or damaged file, or a count out of range,
    counts as none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON, or an int past 4300 digits
        return {}
    return {str(k): v for k, v in data.items() if sane_count(v)} if isinstance(data, dict) else {}


def agreed_starts(gathered: list[int], warn: bool) -> int:
    """This start's number from every rank's recorded count, indexed by rank: one past the largest
    in range. A count out of range is a peer's lie or damage; it is skipped, named once if ``warn``."""
    bad = [str(rank) for rank, value in enumerate(gathered) if not sane_count(value)]
    if bad and warn:  # eight named at most: one short line however many ranks lie
        ranks = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        print(f"train: warning: start count from rank(s) {ranks} out of range (not 0..{STARTS_LIMIT - 1}): "
              "ignored, the other ranks' count stands", file=sys.stderr, flush=True)
    return max((v for v in gathered if sane_count(v)), default=0) + 1


def count_start(run_dir: Path, rdzv_id: str, host_leader: bool, device: torch.device) -> int:
    """This start's number (1 for the first); a collective: every rank must call it. ``rdzv_id``
    "" (outside torchrun, the same on every rank): 1, not recorded."""
    path = run_dir / STARTS_FILE
    recorded = read_starts(path) if rdzv_id else {}
    starts = agreed_starts(dist.all_gather_ints(recorded.get(rdzv_id, 0), device), host_leader)
    if host_leader and rdzv_id:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**recorded, rdzv_id: starts})
    return starts
