"""progress.json's throttle runs on a monotonic clock (findings longrun56, 7): it ran on the wall
clock, so a clock stepped back by D seconds mid-epoch (a VM resumed, NTP or chrony stepping, `date`)
left progress.json unwritten for D seconds, up to the epoch's end, and `fab status` showed a stall.

The real MetricsSink writing real files; the throttle's clock is injected (a wall clock cannot be
stepped back here without root), and the records carry the wall-clock times a stepped clock gives."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.layout import PROGRESS
from meshrun.train.metrics import MetricsSink, ProgressRecord, due

EVERY = 5.0  # log.progress_seconds
WALL = 1_700_000_000.0  # the wall clock at the first record
STEPPED_BACK = 3600.0  # how far the wall clock steps back mid-epoch


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(step: int, wall: float) -> ProgressRecord:
    return ProgressRecord(epoch=0, step_in_epoch=step, steps_per_epoch=1000, global_step=step, world_size=2, time=wall)


def written(run_dir: Path) -> tuple[int, float]:
    shown = json.loads((run_dir / PROGRESS).read_text())
    return shown["global_step"], shown["time"]


def offer(sink: MetricsSink, step: int, wall: float) -> bool:
    """What the trainer's loop does each step (trainer.py): build and write the record only when due."""
    if not sink.progress_due():
        return False
    sink.progress(record(step, wall))
    return True


def test_a_wall_clock_stepped_back_does_not_hold_progress_back(tmp_path: Path) -> None:
    clock = Clock(50.0)  # soon after boot: a monotonic clock may read less than progress_seconds
    sink = MetricsSink(tmp_path, 0, True, EVERY, False, clock=clock)
    assert offer(sink, 1, WALL)  # the first record is due at once
    assert written(tmp_path) == (1, WALL)
    clock.now = 50.0 + EVERY - 0.25
    assert not offer(sink, 2, WALL + EVERY - 0.25)  # throttled
    assert written(tmp_path) == (1, WALL)
    # The wall clock steps back an hour while EVERY seconds pass: the record is still due, and written
    # with the wall clock's (earlier) time, which is what the host's clock says.
    clock.now = 50.0 + EVERY
    assert offer(sink, 3, WALL + EVERY - STEPPED_BACK)
    assert written(tmp_path) == (3, WALL + EVERY - STEPPED_BACK)
    clock.now = 50.0 + 2 * EVERY
    assert offer(sink, 4, WALL + 2 * EVERY - STEPPED_BACK)
    assert written(tmp_path) == (4, WALL + 2 * EVERY - STEPPED_BACK)
    sink.close()


def test_progress_called_directly_throttles_on_the_clock_not_on_the_records_time(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    sink = MetricsSink(tmp_path, 0, True, EVERY, False, clock=clock)
    sink.progress(record(1, WALL))
    sink.progress(record(2, WALL - STEPPED_BACK))  # the same instant on the clock: not due
    assert written(tmp_path) == (1, WALL)
    clock.now += EVERY
    sink.progress(record(3, WALL - STEPPED_BACK))
    assert written(tmp_path) == (3, WALL - STEPPED_BACK)
    sink.progress(record(4, WALL), force=True)  # an epoch's end writes whatever the throttle says
    assert written(tmp_path) == (4, WALL)
    sink.close()


def test_only_rank_0_is_ever_due(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, 1, False, EVERY, False, clock=Clock(0.0))
    assert not sink.progress_due()
    sink.progress(record(1, WALL), force=True)
    assert not (tmp_path / PROGRESS).exists()
    sink.close()


def test_due() -> None:
    assert due(None, 0.0, EVERY)
    assert not due(10.0, 10.0 + EVERY - 0.001, EVERY)
    assert due(10.0, 10.0 + EVERY, EVERY)
