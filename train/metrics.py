"""Run-directory outputs: JSONL metrics, progress.json, result.json, TensorBoard scalars.

Contract (files under the run dir):
- ``metrics.jsonl`` (rank 0, appended, one JSON object per line, flushed per record):
  ``config``, ``balance``, ``resume`` and ``epoch`` records (see the dataclasses below);
- ``metrics.rank<R>.jsonl`` (every rank): ``step`` performance records (each aggregates
  ``perf.every_steps`` optimizer steps) and one ``comm`` record, buffered and flushed every
  ``FLUSH_EVERY`` records and at each epoch end;
- ``progress.json`` (rank 0, atomically replaced at most every ``progress_seconds`` and at each
  epoch end) and ``result.json`` (rank 0, atomically, only at a successful end);
- ``tensorboard/`` (rank 0) when enabled, and the same scalars to Weights & Biases with
  ``log.wandb`` (``wandb/``, see ``train.wandblog``).

A resumed run appends to these. A fresh start (nothing restored) in a used run dir first sets the
earlier run's aside (``MetricsSink.set_aside_earlier_run``): renamed ``<name>.earlier-<UTC time>``,
never deleted, and matched by no reader's ``metrics*.jsonl``, so this run's records stand alone.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Collection

from meshrun.fsutil import atomic_write_json
from meshrun.layout import METRICS, PROGRESS, RANK_METRICS_GLOB, RESULT, RecordKind, rank_metrics
from meshrun.train.wandblog import Tracker

FLUSH_EVERY = 200
TENSORBOARD = "tensorboard"
_RANK_FILE = re.compile(r"metrics\.rank(\d+)\.jsonl")


@dataclass(frozen=True)
class EpochRecord:
    epoch: int  # epochs completed, 1-based
    train_loss: float
    test_loss: float
    test_acc: float  # fraction 0..1
    test_acc5: float
    lr: float
    world_size: int
    global_step: int
    time: float
    samples_seen: int
    train_seconds: float
    eval_seconds: float
    train_acc: float = 0.0  # real samples of all ranks, weighted by samples
    batch_sizes: tuple[int, ...] = ()  # per rank
    rank_samples: tuple[int, ...] = ()  # real samples each rank used (since a resume, if any)
    rank_samples_per_s: tuple[float, ...] = ()  # rank_samples / that rank's epoch wall time
    consumed_before: int = 0  # samples of this epoch used before a mid-epoch resume
    coverage_min: int = 0  # fewest / most times any sample of the epoch reached the model,
    coverage_max: int = 0  # over all ranks (1 and 1: every sample exactly once)
    # Of eval_seconds: making the replicas one model before evaluating (DiLoCo and hier: the
    # round in flight and the partial one cross the links; local SGD: one average). 0 for DDP.
    sync_seconds: float = 0.0
    kind: RecordKind = RecordKind.EPOCH


@dataclass(frozen=True)
class ResumeRecord:
    from_step: int
    epoch: int  # epochs completed in the restored checkpoint
    world_size: int  # the resuming run's world size
    saved_world_size: int
    consumed_in_epoch: int
    source_rank: int
    time: float
    kind: RecordKind = RecordKind.RESUME


@dataclass(frozen=True)
class StepRecord:
    """``steps`` consecutive optimizer steps on one rank, ending at ``global_step`` (one record
    per ``perf.every_steps`` steps keeps the per-step cost to a few additions). Times are
    per-step means in seconds; on CUDA they are taken after a synchronize, so they are device
    time, not launch time."""

    rank: int
    host: str
    epoch: int
    global_step: int  # the last step of the window
    samples: int  # real samples this rank consumed in the window
    data_s: float  # waiting for the data loader
    fwd_bwd_s: float  # forward + backward, including DDP's gradient all-reduce
    optim_s: float  # clipping + optimizer step
    step_s: float  # wall time per step
    samples_per_s: float  # this rank: samples / window wall time
    total_samples_per_s: float  # all ranks' real samples of the window / this rank's wall time
    peak_mem_bytes: int
    mem_kind: str
    time: float
    steps: int = 1
    kind: RecordKind = RecordKind.STEP


@dataclass(frozen=True)
class CommRecord:
    """Gradient communication cost, measured as the difference of median fwd+bwd times with
    and without DDP gradient sync (``no_sync``) on the same batch."""

    rank: int
    host: str
    method: str
    steps: int
    sync_s: float
    no_sync_s: float
    comm_s: float
    world_size: int
    time: float
    kind: RecordKind = RecordKind.COMM


@dataclass(frozen=True)
class BalanceRecord:
    """Per-rank batch sizes chosen before training (``train.balance``); ``probes`` holds each
    auto rank's probe (sizes tried, median seconds, samples/s, memory cap), else null."""

    batch_sizes: tuple[int, ...]
    hosts: tuple[str, ...]
    sources: tuple[str, ...]
    global_batch_size: int
    steps_per_epoch: int
    probes: tuple[dict[str, Any] | None, ...]
    world_size: int
    time: float
    kind: RecordKind = RecordKind.BALANCE


@dataclass(frozen=True)
class ProgressRecord:
    """Read by `fab status --watch` (deploy/run/progress.py): two of them give the rate and the ETA."""
    epoch: int  # 0-based epoch in progress
    step_in_epoch: int
    steps_per_epoch: int
    global_step: int
    world_size: int
    time: float
    samples_seen: int = 0  # real samples of all ranks since the run began
    epochs: int = 0  # the epochs the run is to train
    restarts: int = 0  # starts of the worker group before this one
    host_batches: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # host: its ranks' batch sizes
    since: tuple[float, int, int] = (0.0, 0, 0)  # this start's first record: time, global_step, samples_seen


@dataclass(frozen=True)
class ResultRecord:
    epochs_completed: int
    metrics: dict[str, float]
    best_test_acc: float
    world_size: int
    restarts: int
    global_step: int
    batch_sizes: list[int]  # per rank
    rank_hosts: list[str]  # per rank
    global_batch_size: int
    batch_source: str  # config | inventory | auto (several joined by '+')
    rank_samples_per_s: list[float]  # per rank, over this process's epochs
    samples_per_s: dict[str, float]  # per host: the sum over its ranks


def as_json(record: Any) -> dict[str, Any]:
    out = dataclasses.asdict(record)
    return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in out.items()}


class MetricsSink:
    """Writes this rank's share of the run-dir outputs; ``is_main`` selects the rank-0 files."""

    def __init__(self, run_dir: Path, rank: int, is_main: bool, progress_seconds: float,
                 tensorboard: bool, clock: Callable[[], float] = time.monotonic) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.rank, self.is_main = run_dir, rank, is_main
        self.progress_seconds = progress_seconds
        # The throttle's clock is monotonic: a wall clock stepped back (a VM resumed, NTP, `date`) froze
        # progress.json until the epoch's end. The records keep the wall clock: their readers compare hosts.
        self._clock = clock
        self._last_progress: float | None = None  # on `clock`; None: nothing written yet
        self._main: IO[str] | None = open(run_dir / METRICS, "a") if is_main else None
        self._rank = open(run_dir / rank_metrics(rank), "a")
        self._pending: list[str] = []
        self._tb_wanted = is_main and tensorboard
        self._tb: Any = None  # made at the first scalars: a fresh start may set the folder aside first
        self._tracker: Tracker | None = None  # rank 0, log.wandb: gets what TensorBoard gets
        self._succeeded = False  # result() was written: the tracker's run ends with exit code 0

    def set_aside_earlier_run(self, world_size: int, log: Callable[[str], None]) -> list[str]:
        """A fresh start (nothing restored) in a used run dir, before anything is written: this
        rank's file and, on rank 0, metrics.jsonl, tensorboard/ and the rank files of ranks past
        ``world_size`` of an earlier run are renamed (``set_aside``), so that readers that keep
        each epoch's last record (deploy/run/report.py) see this run's alone. Local files only."""
        names = [rank_metrics(self.rank)]
        if self.is_main:
            names += [METRICS, TENSORBOARD, *sorted(
                p.name for p in self.run_dir.glob(RANK_METRICS_GLOB)
                if (m := _RANK_FILE.fullmatch(p.name)) is not None and int(m.group(1)) >= world_size)]
        self._rank.close()
        if self._main is not None:
            self._main.close()
        moved = set_aside(self.run_dir, names, time.time())
        self._main = open(self.run_dir / METRICS, "a") if self.is_main else None
        self._rank = open(self.run_dir / rank_metrics(self.rank), "a")
        for old, new in moved:
            log(f"fresh start: {old} of an earlier run in {self.run_dir} moved to {new}")
        return [new for _, new in moved]

    def event(self, record: Any, extra: dict[str, Any] | None = None) -> None:
        """Append a rank-0 record to metrics.jsonl (no-op elsewhere)."""
        if self._main is None:
            return
        self._main.write(json.dumps({**as_json(record), **(extra or {})}) + "\n")
        self._main.flush()

    def config(self, resolved: dict[str, Any]) -> None:
        if self._main is not None:
            self._main.write(json.dumps({"kind": RecordKind.CONFIG.value, "time": time.time(),
                                         "config": resolved}) + "\n")
            self._main.flush()

    def rank_record(self, record: Any) -> None:
        self._pending.append(json.dumps(as_json(record)))
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._rank.write("\n".join(self._pending) + "\n")
            self._pending.clear()
        self._rank.flush()

    def progress_due(self) -> bool:
        """Whether ``progress`` would write now (lets callers skip building the record)."""
        return self.is_main and due(self._last_progress, self._clock(), self.progress_seconds)

    def progress(self, record: ProgressRecord, force: bool = False) -> None:
        if not self.is_main:
            return
        now = self._clock()
        if force or due(self._last_progress, now, self.progress_seconds):
            atomic_write_json(self.run_dir / PROGRESS, as_json(record))
            self._last_progress = now

    def result(self, record: ResultRecord) -> None:
        self._succeeded = True
        if self.is_main:
            atomic_write_json(self.run_dir / RESULT, as_json(record))

    def track(self, tracker: Tracker | None) -> None:
        """Send the scalars to an experiment tracker too (``train.wandblog``), and close it last."""
        self._tracker = tracker

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self._tb is None and self._tb_wanted:
            self._tb = _tensorboard(self.run_dir)
        if self._tb is not None:
            for tag, value in values.items():
                self._tb.add_scalar(tag, value, step)
        if self._tracker is not None:
            self._tracker.log(values, step)

    def close(self) -> None:
        self.flush()
        self._rank.close()
        if self._main is not None:
            self._main.close()
        if self._tb is not None:
            self._tb.close()
        if self._tracker is not None:
            self._tracker.close(0 if self._succeeded else 1)


def due(last: float | None, now: float, every: float) -> bool:
    """Is a write throttled to one per ``every`` seconds due at ``now`` (the last at ``last``, None: none yet)?"""
    return last is None or now - last >= every


def _tensorboard(run_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # slow import: only rank 0, only if on

    return SummaryWriter(log_dir=str(run_dir / TENSORBOARD))


def earlier_name(name: str, stamp: str, taken: Collection[str]) -> str:
    """Where ``name`` of an earlier run goes: ``<name>.earlier-<stamp>`` (``-2``, ``-3``... when
    taken). It ends in no ``.jsonl``, so no reader's ``metrics*.jsonl`` takes it for this run's."""
    base = f"{name}.earlier-{stamp}"
    new, n = base, 1
    while new in taken:
        n += 1
        new = f"{base}-{n}"
    return new


def set_aside(run_dir: Path, names: list[str], now: float) -> list[tuple[str, str]]:
    """Rename each of ``names`` in ``run_dir`` that holds something (a non-empty file or folder)
    to its ``earlier_name``, stamped with ``now`` in UTC; never deletes. Returns (old, new) pairs."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    moved = []
    for name in names:
        path = run_dir / name
        held = path.is_dir() and any(path.iterdir()) or path.is_file() and path.stat().st_size > 0
        if path.is_symlink() or not held:
            continue
        new = earlier_name(name, stamp, {p.name for p in run_dir.iterdir()})
        path.rename(run_dir / new)
        moved.append((name, new))
    return moved
