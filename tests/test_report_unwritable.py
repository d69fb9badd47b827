"""`fab report` in a run folder it cannot write in: the table and the JSON, with the plot's loss in
one line, never an internal error. As root nothing refuses a write by its mode, so the folder's
report.png is made a directory: the same OSError a read-only or foreign runs folder gives."""

from __future__ import annotations

import json
from pathlib import Path

from tests.clirun import git_project, run_meshrun
from tests.test_report import make_run

RUN = "20261206-180000-abcd"


def trainer_run(project: Path) -> Path:
    home = project / "runs" / RUN
    make_run(home / "hosts")
    launch = {"run_id": RUN, "inventory": str(project / "hosts.yaml"), "hosts": ["gpu1", "gpu2"], "started": 1000.0,
              "detached": False, "rdzv_endpoint": "standalone", "rdzv_id": RUN, "elastic": None,
              "workload": {"script": None, "config": None, "args": []}, "controller_pid": None}
    (home / "launch.json").write_text(json.dumps(launch))
    return home


def test_report_where_the_plot_cannot_be_written_prints_the_table_and_says_so(tmp_path: Path) -> None:
    project = git_project(tmp_path)
    home = trainer_run(project)
    (home / "report.png").mkdir()  # what the plot would be written over
    done = run_meshrun(project, "report")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    warned = [line for line in (done.stdout + done.stderr).splitlines() if "plot not written" in line]
    assert len(warned) == 1 and str(home / "report.png") in warned[0] and "the table below is complete" in warned[0]
    assert "final test acc 0.8000, best 0.8000; resumes 1; plot: not written" in done.stdout
    as_json = run_meshrun(project, "report", "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert (shown["png"], shown["final_test_acc"], [r["host"] for r in shown["ranks"]]) == (None, 0.8, ["gpu1", "gpu2"])


def test_report_where_it_can_write_still_draws_the_plot(tmp_path: Path) -> None:
    project = git_project(tmp_path)
    home = trainer_run(project)
    done = run_meshrun(project, "report", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["png"] == str(home / "report.png") and (home / "report.png").stat().st_size > 1000
