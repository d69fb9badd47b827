"""`fab stop` and `fab logs` with no `--run` (the shared-hosts review, finding 7).

With two runs that may still be running in one runs dir (two terminals, two people sharing a
checkout), both took the newest: `fab stop` typed in the older run's terminal stopped the other
one. Now, of several, the hosts are asked which run; several running are refused in one line
naming them, before any host is stopped; one is taken as before. Real records in a real runs dir;
the hosts' answers stand in (their asking is tested on real agents in tests/test_status_fanout.py)."""

from __future__ import annotations

import json

import time
from pathlib import Path
from typing import Callable

import pytest

from meshrun.layout import SUMMARY
from meshrun.deploy.commands import logs, stop
from meshrun.deploy.edges.records import RunRecord, resolve_live_run, several_live
from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project
from meshrun.deploy.run.hoststate import HostState

OLDER, NEWER = "20261201-100000-aaaa", "20261201-105900-bbbb"


def save(runs: Path, run_id: str, hosts: tuple[str, ...], started: float, earlier: tuple[str, ...] = ()) -> RunRecord:
    record = RunRecord(run_id, "/nonexistent/inv.yaml", hosts, started, True, "192.0.2.1:29400", earlier=earlier)
    record.save(runs)
    return record


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path, tmp_path / "runs")


def asked(running: tuple[str, ...], seen: list) -> Callable[[list[RunRecord]], list[HostState]]:
    """The hosts' answers (`run_states`, tested on real agents in tests/test_status_fanout.py):
    each candidate run's first host says whether it runs; `seen` records which runs were asked."""
    def ask(live: list[RunRecord]) -> list[HostState]:
        seen.append([r.run_id for r in live])
        return [HostState(r.run_id, r.hosts[0], "running" if r.run_id in running else "exited") for r in live]
    return ask


def test_two_runs_running_are_named_and_neither_is_taken(project: Project) -> None:
    now = time.time()
    save(project.runs, OLDER, ("gpu1", "gpu2"), now - 3600)
    save(project.runs, NEWER, ("gpu2", "gpu3", "gpu9"), now - 60, earlier=("gpu9",))  # gpu9: an earlier attempt's
    expected = (f"2 runs may still be running: {NEWER} (gpu2,gpu3), {OLDER} (gpu1,gpu2); "
                "name one: fab stop --run ID")
    seen: list = []
    with pytest.raises(InputError) as refused:
        resolve_live_run(project.runs, None, "fab stop", None, asked((OLDER, NEWER), seen))
    assert (str(refused.value), seen) == (expected, [[NEWER, OLDER]])
    with pytest.raises(InputError) as refused:
        resolve_live_run(project.runs, None, "fab logs", None, asked((OLDER, NEWER), []))
    assert str(refused.value) == expected.replace("fab stop", "fab logs")
    assert resolve_live_run(project.runs, OLDER, "fab stop").run_id == OLDER  # named: as before


def test_of_several_that_may_run_the_one_its_hosts_say_runs_is_taken(project: Project) -> None:
    """Detached runs never get a summary: every one ever started 'may' run, and refusing them all
    would make --run compulsory for anyone who ever detached twice. Their hosts are asked."""
    now = time.time()
    save(project.runs, OLDER, ("gpu1",), now - 3600)
    save(project.runs, NEWER, ("gpu2",), now - 60)
    assert resolve_live_run(project.runs, None, "fab stop", None, asked((OLDER,), [])).run_id == OLDER
    assert resolve_live_run(project.runs, None, "fab stop", None, asked((), [])).run_id == NEWER  # none: the newest


def test_stop_and_logs_ask_the_hosts_before_choosing(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands themselves: both runs running is refused by name before any host is stopped."""
    now = time.time()
    save(project.runs, OLDER, ("gpu1",), now - 3600)
    save(project.runs, NEWER, ("gpu2",), now - 60)
    seen: list = []
    for command in (stop, logs):
        monkeypatch.setattr(command, "run_states", lambda live, root: asked((OLDER, NEWER), seen)(live))
    with pytest.raises(InputError, match="^2 runs may still be running: .*name one: fab stop --run ID$"):
        stop.main(None, project)
    with pytest.raises(InputError, match="^2 runs may still be running: .*name one: fab logs --run ID$"):
        logs.main(None, False, 20, project)
    assert seen == [[NEWER, OLDER], [NEWER, OLDER]]


def test_one_run_that_may_still_be_running_is_taken_as_before(project: Project) -> None:
    now = time.time()
    save(project.runs, OLDER, ("gpu1",), now - 3600)
    save(project.runs, NEWER, ("gpu2",), now - 60)
    (project.runs / OLDER / SUMMARY).write_text(json.dumps({"run_id": OLDER, "status": "succeeded"}))  # it ended
    assert resolve_live_run(project.runs, None, "fab stop").run_id == NEWER


def test_none_running_is_the_line_of_before(project: Project) -> None:
    save(project.runs, OLDER, ("gpu1",), time.time() - 3600)
    (project.runs / OLDER / SUMMARY).write_text(json.dumps({"run_id": OLDER, "status": "succeeded"}))
    with pytest.raises(InputError, match=f"^no recorded run may still be running; name one with --run ID "
                                         f"\\(the newest is {OLDER}\\)$"):
        resolve_live_run(project.runs, None, "fab stop")


def test_many_are_counted_past_the_first_eight() -> None:
    records = [RunRecord(f"20261201-1000{n:02d}-aaaa", "/inv.yaml", ("h",), float(n), True, "e") for n in range(10)]
    line = several_live(records, "fab logs")
    assert line.startswith("10 runs may still be running: 20261201-100000-aaaa (h), ")
    assert line.endswith("20261201-100007-aaaa (h) and 2 more (fab status lists them); name one: fab logs --run ID")
