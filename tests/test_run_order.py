"""Which run is newest (a scale/concurrency review, defect 7).

Run ids carried the controller's local time and the newest run was the one whose folder name sorted
last: after a flight west or a DST change a new run's id sorted before an older one's, and `fab
stop`, `logs`, `fetch-checkpoints` and `report` with no `--run` took the older run. Ids are now in
UTC, and the newest run is the one that started last. Real records in a real runs dir."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from meshrun.deploy.edges.records import RunRecord, all_records, live_records, new_run_id, resolve_run


def save(runs: Path, run_id: str, started: float, detached: bool = True) -> None:
    RunRecord(run_id, "/inv.yaml", ("h1",), started, detached, "192.0.2.1:29400").save(runs)


def test_the_newest_run_is_the_one_started_last_not_the_name_that_sorts_last(tmp_path: Path) -> None:
    """Started at 10:00 local time in Berlin, then at 09:30 local time in New York (hours later):
    the second's id sorts first."""
    runs = tmp_path / "runs"
    save(runs, "20260301-100000-aaaa", 1_772_355_600.0)
    save(runs, "20260301-093000-bbbb", 1_772_375_400.0)
    save(runs, "20260301-093000-aaaa", 1_772_375_400.0)  # the same second: the id decides
    assert [r.run_id for r in all_records(runs)] == ["20260301-093000-bbbb", "20260301-093000-aaaa",
                                                     "20260301-100000-aaaa"]
    assert resolve_run(runs, None).run_id == "20260301-093000-bbbb"
    assert resolve_run(runs, None, live_only=True).run_id == "20260301-093000-bbbb"  # detached, no summary
    assert [r.run_id for r in live_records(runs)] == [r.run_id for r in all_records(runs)]


def test_a_run_id_is_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """At UTC+14 the local date is a day ahead of UTC's for ten hours of every day: an hour apart at least."""
    monkeypatch.setenv("TZ", "XXX-14")
    time.tzset()
    try:
        before = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run_id = new_run_id()
        after = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert before <= run_id[:15] <= after and len(run_id) == 20 and run_id[15] == "-"
    assert os.environ.get("TZ") != "XXX-14"
