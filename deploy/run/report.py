"""Read a run directory (or one fetched per host) into typed records, and plot it.

Pure functions of files; no torch, no process group. Layouts accepted by ``load_report(root)``:
- ``root`` is a run dir (``metrics.jsonl`` and/or ``metrics.rank<R>.jsonl`` inside);
- ``root`` holds one run dir per host (``root/<host>/metrics*.jsonl``), as fetched from hosts
  that do not share storage. Epoch records come from whichever host had rank 0; when a resume
  repeated an epoch, the record written last wins.

The files come from hosts, so every line is shape-checked like any other host answer
(deploy/run/answers.py): a line that is not JSON, not an object, nested past the recursion limit,
not UTF-8, longer than METRICS_LINE_MAX, or a record whose fields have the wrong type (`"epoch":
"a"`, `"loss": {}`, NaN or 10**400 for a time, `true` for a number) is skipped and counted, and
`RunReport.skipped` says, per file, how many lines and why the first one was; only regular files
are read, and at most METRICS_FILE_MAX bytes of each: of a longer one, its start (what a run writes
as it begins: the comm probe, the first epochs) and its end (the recent steps, the last epochs), the
middle left out and said. Never an exception.
"""

from __future__ import annotations

import math
import os
import statistics
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from meshrun.deploy.inventory.shown import clip, shown, shown_path
from meshrun.deploy.run.answers import MISSING, from_json, is_int, is_real
from meshrun.layout import METRICS, RANK_METRICS_GLOB, RecordKind

# Bytes read of one metrics file. A step record is ~400 B: at 5 steps/s, one per 20 steps, a rank's
# file grows ~8 MiB a day, so a run of weeks passes this; of such a file the last bytes are read
# (step medians describe the run as it goes now, not its first days) and its first 1/HEAD_SHARE.
METRICS_FILE_MAX = 64 << 20
HEAD_SHARE = 16  # of METRICS_FILE_MAX, the part read from a long file's start: what a run writes as it begins
METRICS_LINE_MAX = 1 << 20  # bytes of one line; a record is under 1 KiB, an epoch's per-rank lists a few
HOST_LABEL_MAX = 64  # characters of a host name a step record gives
T = TypeVar("T")


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
    skipped: tuple[str, ...] = ()  # per file with unusable lines: how many, and why the first

    @property
    def final_test_acc(self) -> float | None:
        return self.epochs[-1].test_acc if self.epochs else None

    @property
    def best_test_acc(self) -> float | None:
        return max((e.test_acc for e in self.epochs), default=None)

    @property
    def total_samples_per_s(self) -> float:
        return sum(r.samples_per_s for r in self.ranks)


class BadLine(ValueError):
    """Why one line of a metrics file is no record the report can use."""


@dataclass
class MetricsFile:
    """One metrics file from a host, read line by line: the JSON objects in it; every other line
    is counted with why, and said in `note`."""

    path: Path
    steps: bool = False  # a rank's file, whose step records are medians: said in the note of a long one
    lines: int = 0
    skipped: int = 0
    first: str = ""  # `where: why` of the first skipped line
    unread: str = ""  # why the file, or part of it, was not read
    tail_from: int | None = None  # a file too long to read whole: the byte where its read end begins
    claim: str = ""  # the host its records name, where that is not the folder it was fetched from

    def rows(self) -> Iterator[tuple[str, dict[str, Any], bool]]:
        """(where, object, from the end) of every line that is a JSON object. `where` names the line
        for a note: `line N`, or in the end of a file too long to read whole (its middle's lines are
        not counted), the byte it begins at; `from the end` is False for every line of a whole file."""
        for offset, raw in self._raw_lines():
            self.lines += 1
            tail = self.tail_from is not None and offset >= self.tail_from
            where = f"the line at byte {offset}" if tail else f"line {self.lines}"
            if raw is None:
                self.skip(where, f"longer than {_size(METRICS_LINE_MAX)}")
                continue
            try:
                value = from_json(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.skip(where, "not UTF-8")
                continue
            if isinstance(value, dict):
                yield where, value, tail
            else:
                self.skip(where, "not JSON" if value is MISSING else f"{shown(value)} is not a JSON object")

    def check(self, where: str, row: dict[str, Any], read: Callable[[dict[str, Any]], T]) -> T | None:
        """`read(row)`, or None when the row has a wrong field (the line is counted as skipped)."""
        try:
            return read(row)
        except BadLine as why:
            self.skip(where, str(why))
            return None

    def skip(self, where: str, why: str) -> None:
        self.skipped += 1
        self.first = self.first or f"{where}: {why}"

    def note(self) -> tuple[str, ...]:
        where = shown_path(self.path)
        notes = [f"{where}: {self.unread}"] if self.unread else []
        if self.claim:
            notes.append(f"{where}: its records name host {shown(self.claim)}; shown under the host it was "
                         "fetched from")
        if self.skipped:
            first = "the first, " if self.skipped > 1 else ""
            notes.insert(0, f"{where}: {self.skipped} of {self.lines} line(s) skipped, not a metrics record "
                            f"the report can use ({first}{self.first})")
        return tuple(notes)

    def _raw_lines(self) -> Iterator[tuple[int, bytes | None]]:
        """(byte offset, line) of each line read, None for one over METRICS_LINE_MAX; a regular file
        only (a FIFO or a device is not waited on, nor read forever). Up to METRICS_FILE_MAX bytes
        it is read whole (to its size when opened: what is written since is for the next report);
        past that, its first METRICS_FILE_MAX / HEAD_SHARE bytes and then its last bytes, from the
        first line that begins in them: a week-long run is reported as it goes now."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as err:
            self.unread = f"not read ({err.strerror})"
            return
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self.unread = "not read: not a regular file"
            return
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(fd).st_size
            if size <= METRICS_FILE_MAX:
                yield from _lines(handle, 0, size)
                return
            head = METRICS_FILE_MAX // HEAD_SHARE
            self.tail_from = _line_after(handle, size - (METRICS_FILE_MAX - head), size)  # known to rows() first
            medians = " (its step medians are of the last part)" if self.steps else ""
            self.unread = (f"{_size(size)} long: only its first {_size(head)} and its last "
                           f"{_size(METRICS_FILE_MAX - head)} are read{medians}; the "
                           f"{_size(size - METRICS_FILE_MAX)} between are not in the report")
            handle.seek(0)
            yield from _lines(handle, 0, head)
            handle.seek(self.tail_from)
            yield from _lines(handle, self.tail_from, size)


def _lines(handle: BinaryIO, start: int, end: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset, line) of each line from byte `start` (where `handle` is) up to byte `end`, None for
    one over METRICS_LINE_MAX; the line `end` cuts is not yielded (at the file's end: a torn write,
    which is yielded, and skipped as not JSON)."""
    offset = start
    while offset < end and (raw := handle.readline(min(METRICS_LINE_MAX + 1, end - offset))):
        begins, offset = offset, offset + len(raw)
        too_long = len(raw) > METRICS_LINE_MAX
        while too_long and offset < end and raw and not raw.endswith(b"\n"):
            raw = handle.readline(min(1 << 20, end - offset))  # the rest of a line too long to use
            offset += len(raw)
        if offset >= end and not raw.endswith(b"\n") and handle.read(1):
            return  # cut by the bound, not the file's end: not a whole line
        yield begins, None if too_long else raw


def _line_after(handle: BinaryIO, cut: int, end: int) -> int:
    """Where the first line that begins at or after byte `cut` begins (at most `end`). The line the
    cut falls in is read through (1 MiB at a time), never used."""
    offset = cut - 1  # the byte before: a newline there means a line begins at the cut itself
    handle.seek(offset)
    while offset < end:
        raw = handle.readline(min(1 << 20, end - offset))
        offset += len(raw)
        if not raw or raw.endswith(b"\n"):
            break
    return offset


def _size(count: int) -> str:
    if count < 1 << 20:
        return f"{count} bytes"
    return f"{count >> 20} MiB" if not count % (1 << 20) else f"{count / (1 << 20):.1f} MiB"


def _bad(key: str, value: object, expected: str) -> BadLine:
    return BadLine(f"{key} is {'missing' if value is MISSING else shown(value)}; expected {expected}")


def _whole(row: dict[str, Any], key: str, below: int = 2**63) -> int:
    value = row.get(key, MISSING)
    if not (is_int(value) and 0 <= value < below):
        raise _bad(key, value, "a whole number >= 0")
    return value


def _number(row: dict[str, Any], key: str, low: float = -math.inf, high: float = math.inf,
            expected: str = "a number") -> float:
    """A finite number in [low, high]."""
    value = row.get(key, MISSING)
    if not (is_real(value) and low <= value <= high):
        raise _bad(key, value, expected)
    return float(value)


LOSS_MAX = 1e30  # of a finite loss: 1e308 and -1e308 on one axis overflow its range (matplotlib raises)


def _loss(row: dict[str, Any], key: str) -> float:
    """A loss: NaN (the trainer writes it for a test set it could not use), ±inf (a diverged run) or
    a number within ±LOSS_MAX; a larger finite one is no loss a trainer wrote, and its line is skipped."""
    value = row.get(key, MISSING)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if is_real(value) and abs(value) > LOSS_MAX:  # type: ignore[arg-type]
        raise _bad(key, value, f"a number within ±{LOSS_MAX:g}, NaN or ±inf")
    return _number(row, key)


def _seconds(row: dict[str, Any], key: str) -> float:
    return _number(row, key, low=0.0, expected="a number >= 0")


def run_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    """(host label, directory) for ``root`` and each direct subdirectory holding metrics."""
    for directory in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        if any(directory.glob("metrics*.jsonl")):
            yield (directory.name if directory != root else "local"), directory


def load_report(root: Path) -> RunReport:
    epochs: dict[int, tuple[float, EpochPoint]] = {}
    ranks, resumes, files = [], 0, []
    for host, directory in run_dirs(root):
        main = directory / METRICS
        if main.exists() or main.is_symlink():
            files.append(MetricsFile(main))
            resumes += _read_main(files[-1], epochs)
        for path in sorted(directory.glob(RANK_METRICS_GLOB)):
            files.append(MetricsFile(path, steps=True))
            summary = _rank(host, files[-1], fetched=directory != root)
            if summary is not None:
                ranks.append(summary)
    ordered = tuple(p for _, (_, p) in sorted(epochs.items()))
    return RunReport(root, ordered, tuple(sorted(ranks, key=lambda r: (r.host, r.rank))), resumes,
                     tuple(note for f in files for note in f.note()))


def _read_main(file: MetricsFile, epochs: dict[int, tuple[float, EpochPoint]]) -> int:
    """Rank 0's `metrics.jsonl`: its epoch records into `epochs` (the one written last wins); the
    number of resume records."""
    resumes = 0
    for where, row, _ in file.rows():
        kind = _kind(file, where, row)
        point = file.check(where, row, _epoch) if kind == RecordKind.EPOCH.value else None
        if point is not None and (point.epoch not in epochs or epochs[point.epoch][0] <= point.time):
            epochs[point.epoch] = (point.time, point)
        resumes += kind == RecordKind.RESUME.value
    return resumes


def _kind(file: MetricsFile, where: str, row: dict[str, Any]) -> str | None:
    """The record's kind; a line without one (or not text) is skipped. Other kinds are the trainer's
    to add: they are left alone, not counted."""
    kind = row.get("kind", MISSING)
    if not isinstance(kind, str):
        file.skip(where, f"kind is {'missing' if kind is MISSING else shown(kind)}; expected text")
        return None
    return kind


def _epoch(row: dict[str, Any]) -> EpochPoint:
    return EpochPoint(_whole(row, "epoch"), _loss(row, "train_loss"), _loss(row, "test_loss"),
                      _number(row, "test_acc", 0.0, 1.0, "a number from 0 to 1"),
                      _number(row, "test_acc5", 0.0, 1.0, "a number from 0 to 1"),
                      _whole(row, "world_size"), _whole(row, "global_step"), _number(row, "time"))


def _step(row: dict[str, Any]) -> RankThroughput:
    """One step record, as a RankThroughput of that one record."""
    host = row.get("host")
    if host is not None and not isinstance(host, str):
        raise _bad("host", host, "text")
    return RankThroughput(clip(host, HOST_LABEL_MAX) if host else "", _whole(row, "rank", 2**31), 1,
                          _seconds(row, "samples_per_s"), _seconds(row, "step_s"), _seconds(row, "data_s"),
                          _seconds(row, "fwd_bwd_s"), _seconds(row, "optim_s"), _whole(row, "peak_mem_bytes"), None)


def _rank(host: str, file: MetricsFile, fetched: bool = False) -> RankThroughput | None:
    """One rank's file. `fetched`: from `hosts/<host>/`, named by the controller's inventory: the row
    is that host's, whatever its records claim (a host names itself, never another host's row)."""
    steps: list[RankThroughput | None] = []
    comm: list[float | None] = []
    for where, row, from_end in file.rows():
        kind = _kind(file, where, row)
        # Of a file read at both ends, the steps of its start are left out: the medians describe
        # the run as it goes now. Its comm probe is kept: a run that never restarted has only that one.
        if kind == RecordKind.STEP.value and (from_end or file.tail_from is None):
            steps.append(file.check(where, row, _step))
        elif kind == RecordKind.COMM.value:
            comm.append(file.check(where, row, lambda r: _seconds(r, "comm_s")))
    sound = [s for s in steps if s is not None]
    measured = [c for c in comm if c is not None]
    if not sound:
        return None

    def med(key: str) -> float:
        return statistics.median(getattr(s, key) for s in sound)

    claimed = sound[-1].host
    if fetched and claimed and claimed != host:
        file.claim = claimed
    return RankThroughput(host=host if fetched else claimed or host, rank=sound[-1].rank, steps=len(sound),
                          samples_per_s=med("samples_per_s"), step_s=med("step_s"), data_s=med("data_s"),
                          fwd_bwd_s=med("fwd_bwd_s"), optim_s=med("optim_s"),
                          peak_mem_bytes=max(s.peak_mem_bytes for s in sound),
                          comm_s=measured[-1] if measured else None)
