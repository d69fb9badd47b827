"""Read a run directory (or one fetched per host) into typed records, and plot it.

Pure functions of files; no torch, no process group. Layouts accepted by ``load_report(root)``:
- ``root`` is a run dir (``metrics.jsonl`` and/or ``metrics.rank<R>.jsonl`` inside);
- ``root`` holds one run dir per host (``root/<host>/metrics*.jsonl``), as fetched from hosts
  that do not share storage. Epoch records come from whichever host had rank 0; when a resume
  repeated an epoch, the record written last wins.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from meshrun.layout import RecordKind


@dataclass(frozen=True)
class EpochPoint:
    epoch: int
    train_loss: float
    test_loss: float
    test_acc: float
    test_acc5: float
    world_size: int
    global_step: int
    time: float


@dataclass(frozen=True)
class RankThroughput:
    """Medians over one rank's step records (robust to the first, slow steps)."""

    host: str
    rank: int
    steps: int
    samples_per_s: float
    step_s: float
    data_s: float
    fwd_bwd_s: float
    optim_s: float
    peak_mem_bytes: int
    comm_s: float | None  # from the no_sync probe, when it ran


@dataclass(frozen=True)
class RunReport:
    root: Path
    epochs: tuple[EpochPoint, ...]
    ranks: tuple[RankThroughput, ...]
    resumes: int

    @property
    def final_test_acc(self) -> float | None:
        return self.epochs[-1].test_acc if self.epochs else None

    @property
    def best_test_acc(self) -> float | None:
        return max((e.test_acc for e in self.epochs), default=None)

    @property
    def total_samples_per_s(self) -> float:
        return sum(r.samples_per_s for r in self.ranks)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (the writer was killed) is ignored."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    """(host label, directory) for ``root`` and each direct subdirectory holding metrics."""
    for directory in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        if any(directory.glob("metrics*.jsonl")):
            yield (directory.name if directory != root else "local"), directory


def load_report(root: Path) -> RunReport:
    epochs: dict[int, tuple[float, EpochPoint]] = {}
    ranks, resumes = [], 0
    for host, directory in run_dirs(root):
        main = directory / "metrics.jsonl"
        for row in read_jsonl(main) if main.exists() else []:
            if row.get("kind") == RecordKind.EPOCH.value:
                point = _epoch(row)
                if point.epoch not in epochs or epochs[point.epoch][0] <= point.time:
                    epochs[point.epoch] = (point.time, point)
            resumes += row.get("kind") == RecordKind.RESUME.value
        for path in sorted(directory.glob("metrics.rank*.jsonl")):
            summary = _rank(host, read_jsonl(path))
            if summary is not None:
                ranks.append(summary)
    ordered = tuple(p for _, (_, p) in sorted(epochs.items()))
    return RunReport(root, ordered, tuple(sorted(ranks, key=lambda r: (r.host, r.rank))), resumes)


def _epoch(row: dict[str, Any]) -> EpochPoint:
    return EpochPoint(row["epoch"], row["train_loss"], row["test_loss"], row["test_acc"],
                      row["test_acc5"], row["world_size"], row["global_step"], row["time"])


def _rank(host: str, rows: list[dict[str, Any]]) -> RankThroughput | None:
    steps = [r for r in rows if r.get("kind") == RecordKind.STEP.value]
    if not steps:
        return None
    comm = [r["comm_s"] for r in rows if r.get("kind") == RecordKind.COMM.value]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in steps)

    return RankThroughput(host=steps[-1].get("host") or host, rank=steps[-1]["rank"],
                          steps=len(steps), samples_per_s=med("samples_per_s"),
                          step_s=med("step_s"), data_s=med("data_s"), fwd_bwd_s=med("fwd_bwd_s"),
                          optim_s=med("optim_s"),
                          peak_mem_bytes=max(r["peak_mem_bytes"] for r in steps),
                          comm_s=comm[-1] if comm else None)
