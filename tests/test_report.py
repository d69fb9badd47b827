"""deploy.run.report (and render.png): run dirs fetched from several hosts into records and a PNG."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from meshrun.train.metrics import EpochRecord, ResumeRecord, StepRecord, as_json
from meshrun.deploy.commands.report import metrics_root
from meshrun.deploy.errors import InputError
from meshrun.deploy.render.png import write_png
from meshrun.deploy.run.report import load_report


def write(path: Path, records: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(as_json(r)) + "\n" for r in records))


def epoch(n: int, acc: float, t: float) -> EpochRecord:
    return EpochRecord(n, 1.0 / n, 1.2 / n, acc, 0.99, 0.1, 2, 10 * n, t, 100 * n, 1.0, 0.1)


def step(rank: int, host: str, sps: float) -> StepRecord:
    return StepRecord(rank, host, 0, 1, 32, 0.001, 0.01, 0.002, 0.013, sps, 2 * sps, 10_000_000,
                      "rss", 1.0)


def make_run(root: Path) -> None:
    # gpu1 had rank 0 and repeated epoch 2 after a resume; gpu2 only has per-rank files.
    write(root / "gpu1" / "metrics.jsonl",
          [epoch(1, 0.5, 1.0), epoch(2, 0.6, 2.0), ResumeRecord(20, 1, 2, 2, 0, 0, 2.5),
           epoch(2, 0.7, 3.0), epoch(3, 0.8, 4.0)])
    write(root / "gpu1" / "metrics.rank0.jsonl", [step(0, "gpu1", 1000.0), step(0, "gpu1", 1200.0)])
    write(root / "gpu2" / "metrics.rank1.jsonl", [step(1, "gpu2", 800.0)])
    with open(root / "gpu2" / "metrics.rank1.jsonl", "a") as handle:
        handle.write('{"kind": "step", "rank": 1, "tor')  # torn by a kill


def test_load_report_merges_hosts_and_resumed_epochs(tmp_path: Path) -> None:
    make_run(tmp_path)
    report = load_report(tmp_path)
    assert [e.epoch for e in report.epochs] == [1, 2, 3]
    assert report.epochs[1].test_acc == 0.7  # the epoch redone after the resume wins
    assert report.resumes == 1 and report.best_test_acc == 0.8 and report.final_test_acc == 0.8
    assert [(r.host, r.rank, r.samples_per_s) for r in report.ranks] == [
        ("gpu1", 0, 1100.0), ("gpu2", 1, 800.0)]
    assert report.total_samples_per_s == 1900.0


def test_a_run_without_metrics_says_why_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    with pytest.raises(InputError) as err:
        metrics_root(tmp_path, "r1")
    assert str(err.value) == (f"run r1: no metrics under {tmp_path / 'r1'}; bring them home first: "
                              "fab fetch-checkpoints --run r1")
    with pytest.raises(InputError) as err:  # fetching would bring none: a user script writes none
        metrics_root(tmp_path, "r1", "train.py")
    assert str(err.value) == (f"run r1: no metrics under {tmp_path / 'r1'}: it ran --script train.py, and runs of a "
                              "user script record no metrics (only the built-in trainer writes metrics.jsonl)")
    write(tmp_path / "r1" / "hosts" / "gpu1" / "metrics.jsonl", [epoch(1, 0.5, 1.0)])
    assert metrics_root(tmp_path, "r1", "train.py") == tmp_path / "r1" / "hosts"


def test_png_has_size_and_content(tmp_path: Path) -> None:
    from PIL import Image

    make_run(tmp_path / "run")
    path = write_png(load_report(tmp_path / "run"), tmp_path / "out" / "report.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1500, 420)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # curves, bars and text, not a blank canvas
    greens = sum(n for n, (r, g, b) in colors if g > 100 and r < 80 and b < 80)
    assert greens > 1000  # the throughput bars are drawn


# A host writes its metrics files: each crafted line below is skipped, counted and said, and the
# report is the one its sound lines give (issue 20, item 3). (file, line, why it is skipped)
GOOD_EPOCH = {**as_json(epoch(1, 0.5, 1.0))}
GOOD_STEP = {**as_json(step(0, "gpu1", 1000.0))}
CRAFTED = [
    ("main", "[1]", "[1] is not a JSON object"),
    ("main", '"x"', "'x' is not a JSON object"),
    ("rank", "3", "3 is not a JSON object"),
    ("main", "[" * 100_000, "not JSON"),
    ("main", "{" * 3 + '"kind": "epoch"', "not JSON"),
    ("main", b'{"kind": "epoch", "host": "\xff\xfe"}', "not UTF-8"),
    ("main", "x" * (2 << 20), "longer than 1 MiB"),
    ("main", json.dumps({"kind": 7}), "kind is 7; expected text"),
    ("main", json.dumps({"epoch": 1}), "kind is missing; expected text"),
    ("main", json.dumps({"kind": "epoch"}), "epoch is missing; expected a whole number >= 0"),
    ("main", json.dumps({**GOOD_EPOCH, "epoch": "a"}), "epoch is 'a'; expected a whole number >= 0"),
    ("main", json.dumps({**GOOD_EPOCH, "epoch": -1}), "epoch is -1; expected a whole number >= 0"),
    ("main", json.dumps({**GOOD_EPOCH, "train_loss": {"x": 1}}), "train_loss is {'x': 1}; expected a number"),
    ("main", json.dumps({**GOOD_EPOCH, "test_acc": float("nan")}), "test_acc is nan; expected a number from 0 to 1"),
    ("main", json.dumps({**GOOD_EPOCH, "test_acc5": 2}), "test_acc5 is 2; expected a number from 0 to 1"),
    ("main", json.dumps({**GOOD_EPOCH, "time": float("inf")}), "time is inf; expected a number"),
    ("main", json.dumps({**GOOD_EPOCH, "world_size": True}), "world_size is True; expected a whole number >= 0"),
    ("main", json.dumps({**GOOD_EPOCH, "global_step": 10**400}),
     f"global_step is {str(10**400)[:40]}…; expected a whole number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "step_s": "fast"}), "step_s is 'fast'; expected a number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "samples_per_s": float("nan")}), "samples_per_s is nan; expected a number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "data_s": 10**400}),
     f"data_s is {str(10**400)[:40]}…; expected a number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "peak_mem_bytes": 1.5}), "peak_mem_bytes is 1.5; expected a whole number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "optim_s": False}), "optim_s is False; expected a number >= 0"),
    ("rank", json.dumps({**GOOD_STEP, "host": ["gpu1"]}), "host is ['gpu1']; expected text"),
    ("rank", json.dumps({**GOOD_STEP, "rank": 2**40}), f"rank is {2**40}; expected a whole number >= 0"),
    ("rank", json.dumps({"kind": "comm", "comm_s": "x"}), "comm_s is 'x'; expected a number >= 0"),
    ("rank", json.dumps({"kind": "step", "rank": 0}), "samples_per_s is missing; expected a number >= 0"),
]


@pytest.mark.parametrize(("where", "line", "why"), CRAFTED, ids=[f"{i}-{c[0]}" for i, c in enumerate(CRAFTED)])
def test_a_crafted_metrics_line_is_skipped_and_said(tmp_path: Path, where: str, line: str | bytes, why: str) -> None:
    make_run(tmp_path / "sound")
    make_run(tmp_path / "run")
    path = tmp_path / "run" / "gpu1" / ("metrics.jsonl" if where == "main" else "metrics.rank0.jsonl")
    sound = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([sound[0], line if isinstance(line, bytes) else line.encode(), b"\n", *sound[1:]]))
    report, expected = load_report(tmp_path / "run"), load_report(tmp_path / "sound")
    assert (report.epochs, report.ranks, report.resumes) == (expected.epochs, expected.ranks, expected.resumes)
    torn = f"{tmp_path}/sound/gpu2/metrics.rank1.jsonl: 1 of 2 line(s) skipped"
    assert expected.skipped == (f"{torn}, not a metrics record the report can use (line 2: not JSON)",)
    assert report.skipped == (f"{path}: 1 of {len(sound) + 1} line(s) skipped, not a metrics record the report can "
                              f"use (line 2: {why})", expected.skipped[0].replace("/sound/", "/run/"))


def test_files_that_are_not_regular_or_too_big_are_said_and_not_waited_on(tmp_path: Path, monkeypatch) -> None:
    """A FIFO would block a plain read forever, a directory would raise: both are one note. Past
    METRICS_FILE_MAX only a file's start and end are read (tests/test_report_tail.py), and said."""
    from meshrun.deploy.run import report as report_module

    make_run(tmp_path)
    os.mkfifo(tmp_path / "gpu2" / "metrics.rank5.jsonl")
    (tmp_path / "gpu2" / "metrics.rank6.jsonl").mkdir()
    many = tmp_path / "gpu1" / "metrics.rank0.jsonl"
    many.write_text("".join(json.dumps(as_json(step(0, "gpu1", 1000.0 + i))) + "\n" for i in range(100)))
    line = len(many.read_bytes()) // 100
    bound = 10 * line + line // 2
    monkeypatch.setattr(report_module, "METRICS_FILE_MAX", bound)
    report = load_report(tmp_path)
    # The last 9 whole lines of the bound's end (its start holds no whole line): steps 91 to 99.
    assert [(r.host, r.rank, r.steps, r.samples_per_s) for r in report.ranks] == [
        ("gpu1", 0, 9, 1095.0), ("gpu2", 1, 1, 800.0)]
    assert report.skipped == (
        f"{many}: {100 * line} bytes long: only its first {bound // 16} bytes and its last {bound - bound // 16} "
        f"bytes are read (its step medians are of the last part); the {100 * line - bound} bytes between are not "
        "in the report",
        f"{tmp_path}/gpu2/metrics.rank1.jsonl: 1 of 2 line(s) skipped, not a metrics record the report can use "
        "(line 2: not JSON)",
        f"{tmp_path}/gpu2/metrics.rank5.jsonl: not read: not a regular file",
        f"{tmp_path}/gpu2/metrics.rank6.jsonl: not read: not a regular file")
