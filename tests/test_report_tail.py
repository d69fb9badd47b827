"""deploy.run.report on metrics files longer than METRICS_FILE_MAX (a run of weeks): the report
reads their start and their end, so its step medians describe the run as it goes now, and what a
run writes as it begins (the comm probe, the first epochs) is still found. Real files; only the
bound is made small (the logic does not depend on its size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshrun.deploy.run import report as report_module
from meshrun.deploy.run.report import load_report
from meshrun.train.metrics import CommRecord, EpochRecord, ResumeRecord, StepRecord, as_json


def step_line(i: int, step_s: float) -> str:
    """One step record; every one is as long as every other (fixed-width numbers)."""
    record = StepRecord(0, "gpu1", 0, 100_000 + 20 * i, 1280, 0.001, 0.01, 0.002, step_s, 64 / step_s, 64.0,
                        10_000_000, "rss", 1000.0 + i, 20)
    return json.dumps(as_json(record)) + "\n"


def epoch_line(n: int) -> str:
    record = EpochRecord(n, 1.0, 1.0, round(n / 1000, 3), 0.99, 0.1, 2, 10 * n, 5000.0 + n, 100, 1.0, 0.1)
    return json.dumps(as_json(record)) + "\n"


COMM = json.dumps(as_json(CommRecord(0, "gpu1", "no_sync", 5, 0.02, 0.015, 0.005, 2, 999.0))) + "\n"


def test_a_long_run_is_reported_from_its_end_and_keeps_what_its_start_wrote(tmp_path: Path, monkeypatch) -> None:
    """The step time drops from 0.5 to 0.2 s halfway through a rank's file: the medians are the second half's (the
    old reader, from byte 0, gave the first half's). The comm probe, written once as the run began,
    is still found; so are the first epochs of rank 0's file, and its last ones."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [step_line(i, 0.5 if i < 100 else 0.2) for i in range(200)]
    length = len(lines[0])
    assert {len(line) for line in lines} == {length}
    (run / "metrics.rank0.jsonl").write_text(COMM + "".join(lines))
    config = json.dumps({"kind": "config", "time": 1.0, "config": {"epochs": 300}}) + "\n"
    resume = json.dumps(as_json(ResumeRecord(10, 1, 2, 2, 0, 0, 5150.5))) + "\n"
    epochs = [epoch_line(n) for n in range(1, 301)]
    (run / "metrics.jsonl").write_text(config + "".join(epochs[:150]) + resume + "".join(epochs[150:]))
    monkeypatch.setattr(report_module, "METRICS_FILE_MAX", 64 * length)  # 4 lines' start, 60 lines' end

    report = load_report(run)

    (rank,) = report.ranks
    # Lines 140 to 199 (the end's cut falls on a line's start): the second half's step time.
    assert (rank.steps, rank.step_s, rank.samples_per_s, rank.comm_s) == (60, 0.2, 320.0, 0.005)
    numbers = [e.epoch for e in report.epochs]
    assert numbers[0] == 1 and numbers[-1] == 300 and 150 not in numbers  # the middle is not read
    assert report.final_test_acc == 0.3 and report.resumes == 0  # the resume lies in the unread middle
    size = (run / "metrics.rank0.jsonl").stat().st_size
    assert report.skipped[1] == (
        f"{run}/metrics.rank0.jsonl: {size} bytes long: only its first {4 * length} bytes and its last "
        f"{60 * length} bytes are read (its step medians are of the last part); the {size - 64 * length} bytes "
        "between are not in the report")
    assert report.skipped[0].startswith(f"{run}/metrics.jsonl: ") and "step medians" not in report.skipped[0]


@pytest.mark.parametrize(("extra", "steps"), [(0, 15), (16, 15), (-16, 14)],
                         ids=["cut-on-a-line-start", "cut-inside-a-line", "cut-inside-the-line-before"])
def test_the_line_a_cut_falls_in_is_left_out_and_not_called_bad(tmp_path: Path, monkeypatch, extra: int,
                                                                steps: int) -> None:
    """Of 100 lines of L bytes, read under a bound of 16 L (+ extra): a start of L (+ extra / 16)
    and an end of 15 L (+ 15 extra / 16). A line that begins exactly at the end's cut is read; one
    the cut falls in is not, and neither is counted as a skipped line."""
    path = tmp_path / "metrics.rank0.jsonl"
    lines = [step_line(i, 0.5) for i in range(100)]
    path.write_text("".join(lines))
    monkeypatch.setattr(report_module, "METRICS_FILE_MAX", 16 * len(lines[0]) + extra)
    report = load_report(tmp_path)
    assert [r.steps for r in report.ranks] == [steps]
    assert len(report.skipped) == 1 and " 15 lines" not in report.skipped[0]
    assert "skipped" not in report.skipped[0]


def test_a_bad_line_in_the_end_is_named_by_the_byte_it_begins_at(tmp_path: Path, monkeypatch) -> None:
    """The middle's lines are not counted, so a line of the end read is named by its byte offset."""
    path = tmp_path / "metrics.rank0.jsonl"
    lines = [step_line(i, 0.5) for i in range(100)]
    length = len(lines[0])
    lines[95] = "x" * (length - 1) + "\n"
    path.write_text("".join(lines))
    monkeypatch.setattr(report_module, "METRICS_FILE_MAX", 16 * length)
    report = load_report(tmp_path)
    assert [r.steps for r in report.ranks] == [14]
    assert report.skipped[0] == (f"{path}: 1 of 16 line(s) skipped, not a metrics record the report can use "
                                 f"(the line at byte {95 * length}: not JSON)")
