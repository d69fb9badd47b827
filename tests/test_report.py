"""deploy.run.report (and render.png): run dirs fetched from several hosts into records and a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.train.metrics import EpochRecord, ResumeRecord, StepRecord, as_json
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
