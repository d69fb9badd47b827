"""How many times this launch's worker group has started: `restarts` in summary.json is that
count minus one.

torchrun's `TORCHELASTIC_RESTART_COUNT` counts only the restarts that one agent made after a
worker failed; a membership change (a host lost or joining) restarts the whole group without
counting, so it under-reports. Instead, at every start the lowest rank on each host records the
start in `<run dir>/starts.json`, keyed by the rendezvous id (one launch; `fab train --resume`
gets a fresh id and counts afresh). The group agrees on the maximum across hosts — a host that
joined late has seen fewer starts — so the count survives the loss of any host.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from meshrun.fsutil import atomic_write_json
from meshrun.layout import STARTS_FILE
from meshrun.train import dist


def read_starts(path: Path) -> dict[str, int]:
    """The recorded starts per rendezvous id; a missing or damaged file counts as none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def count_start(run_dir: Path, rdzv_id: str, host_leader: bool, device: torch.device) -> int:
    """This start's number (1 for the first); a collective: every rank must call it."""
    path = run_dir / STARTS_FILE
    recorded = read_starts(path)
    starts = max(dist.all_gather_ints(recorded.get(rdzv_id, 0), device)) + 1
    if host_leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**recorded, rdzv_id: starts})
    return starts
