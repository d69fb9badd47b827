"""`fab report` of a built-in trainer run says how the run ended (day2 #7).

A --script run's report began with its outcome (summary.json's status and reason); a trainer run's
did not: a run stopped at epoch 23 of 200 printed `23 epoch(s); final test acc 0.9721, best 0.9805`,
the line a complete run gets, and `--json` had no key to tell them apart. Now its report begins with
`run ID: stopped, reason: ...` (or that there is no summary.json yet, and where to look), the last
epoch of a run that did not finish is `last`, not `final`, and `--json` has `status` and `reason`."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.deploy.commands.report import ended_line, report_json, script_outcome
from meshrun.deploy.run.report import RunReport
from tests.clirun import git_project, run_meshrun

RUN = "20261206-181500-9bc7"


def test_the_line_a_trainer_runs_report_begins_with() -> None:
    stopped = {"status": "stopped", "reason": "interrupted (Ctrl-C)", "failed_host": None}
    assert ended_line(RUN, script_outcome(stopped)) == f"run {RUN}: stopped, reason: interrupted (Ctrl-C)"
    failed = {"status": "failed", "reason": "host 'h1' exited with status 1", "failed_host": "h1"}
    assert ended_line(RUN, script_outcome(failed)) == (
        f"run {RUN}: failed, failed on h1, reason: host 'h1' exited with status 1")
    assert ended_line(RUN, script_outcome({"status": "succeeded", "reason": None})) == f"run {RUN}: succeeded"
    assert ended_line(RUN, script_outcome({"status": "great", "reason": ["x"]})) == f"run {RUN}: status unknown"
    assert ended_line(RUN, script_outcome(None)) == (
        f"run {RUN}: no summary.json (detached, or not ended): fab status --run {RUN}")


def test_the_json_report_has_the_summarys_status_and_reason() -> None:
    report = RunReport(Path("."), (), (), 0)
    stopped = report_json(RUN, report, None, outcome=script_outcome({"status": "stopped", "reason": "idle"}))
    assert (stopped["status"], stopped["reason"]) == ("stopped", "idle")
    assert (report_json(RUN, report, None)["status"], report_json(RUN, report, None)["reason"]) == (None, None)


def a_trainer_run(tmp_path: Path, summary: dict | None) -> Path:
    """An attached trainer run's folder after its end: launch.json, rank 0's metrics, summary.json."""
    project = git_project(tmp_path)
    home = project / "runs" / RUN
    home.mkdir(parents=True)
    (home / "launch.json").write_text(json.dumps({
        "run_id": RUN, "inventory": str(project / "inventory" / "hosts.yaml"), "hosts": ["h1"], "started": 1.0,
        "detached": False, "rdzv_endpoint": "standalone", "rdzv_id": RUN, "elastic": None,
        "workload": {"script": None, "config": None, "args": ["epochs=200"]}, "controller_pid": None}))
    epochs = [{"kind": "epoch", "epoch": n, "train_loss": 0.3, "test_loss": 0.1, "test_acc": acc, "test_acc5": 1.0,
               "world_size": 2, "global_step": 45 * n, "time": 100.0 + n} for n, acc in ((1, 0.9805), (2, 0.9721))]
    (home / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    step = {"kind": "step", "rank": 0, "host": "h1", "samples_per_s": 1000.0, "step_s": 0.02, "data_s": 0.001,
            "fwd_bwd_s": 0.01, "optim_s": 0.001, "peak_mem_bytes": 2**20}
    (home / "metrics.rank0.jsonl").write_text(json.dumps(step) + "\n")
    if summary is not None:
        (home / "summary.json").write_text(json.dumps({"run_id": RUN, "hosts": ["h1"], **summary}))
    return project


def test_the_report_of_a_stopped_trainer_run_says_it_stopped(tmp_path: Path) -> None:
    project = a_trainer_run(tmp_path, {"status": "stopped", "reason": "interrupted (Ctrl-C)", "failed_host": None})
    shown = run_meshrun(project, "report", "--run", RUN, env={"COLUMNS": "200"})
    data = run_meshrun(project, "report", "--run", RUN, "--json")
    assert (shown.returncode, data.returncode) == (0, 0), shown.stderr + data.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"run {RUN}: stopped, reason: interrupted (Ctrl-C)"
    assert (f"total 1000 samples/s; 2 epoch(s); last test acc 0.9721, best 0.9805; resumes 0; "
            f"plot: {project}/runs/{RUN}/report.png") in lines
    report = json.loads(data.stdout)
    assert (report["status"], report["reason"], report["final_test_acc"]) == ("stopped", "interrupted (Ctrl-C)", 0.9721)


def test_the_report_of_a_run_without_its_summary_says_where_to_look(tmp_path: Path) -> None:
    project = a_trainer_run(tmp_path, None)
    shown = run_meshrun(project, "report", "--run", RUN, env={"COLUMNS": "200"})
    data = run_meshrun(project, "report", "--run", RUN, "--json")
    assert shown.stdout.splitlines()[0] == (
        f"run {RUN}: no summary.json (detached, or not ended): meshrun status --run {RUN}"), shown.stderr
    assert "2 epoch(s); final test acc 0.9721" in shown.stdout  # it may have finished: only its end would tell
    assert {k: json.loads(data.stdout)[k] for k in ("status", "reason")} == {"status": None, "reason": None}
    succeeded = a_trainer_run(tmp_path / "b", {"status": "succeeded", "reason": None, "failed_host": None})
    assert run_meshrun(succeeded, "report", "--run", RUN).stdout.splitlines()[0] == f"run {RUN}: succeeded"
