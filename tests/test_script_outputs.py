"""A `--script` run's own outputs (a review of the user-script path).

A script was never told where to write: every rank runs in the host's workdir, the synced code that
every run shares, and `fab fetch-checkpoints` brings only `runs/<id>/` home, so a script that saved
`checkpoint.pth.tar` in its working directory (seed 004's way) had nothing fetched, while the fetch
said its checkpoints were verified and would be pushed back. The agent now gives each rank
`MESHRUN_RUN_DIR`, the run's directory, and the fetch, the elastic failure's hint and the run's last
line say what is true for a script. Pure: the agent's environment, the console's lines and the
summary, from the real functions."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest

from meshrun.deploy.commands.trainend import script_resume_hint
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.host.agentargs import run_env
from meshrun.deploy.inventory.model import ElasticBounds, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.membership import Change, MembershipEvent
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.deploy.run.summary import build_summary
from meshrun.layout import ENV_RUN_DIR
from tests.fakesession import host

RUN = "20260101-000000-5c1d"


def test_each_rank_is_told_the_run_directory_as_an_absolute_path(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the agent runs in the host's workdir
    args = argparse.Namespace(env=[], secret_env={}, run_id=RUN, host="h1")
    env, _ = run_env(args, "mark")
    assert env[ENV_RUN_DIR] == f"{os.path.realpath(tmp_path)}/runs/{RUN}"


def test_the_fetch_of_a_script_run_names_what_came_home_and_promises_no_checkpoint_push(capsys) -> None:  # type: ignore[no-untyped-def]
    report = FetchReport("h1", Path("/p/runs") / RUN / "hosts/h1")
    Renderer().fetch_reports(RUN, f"/p/runs/{RUN}", [report], script="train.py")
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert (f"what train.py wrote under $MESHRUN_RUN_DIR, and the logs: /p/runs/{RUN}/hosts/<host>/ (as each host "
            "had it; docs/scripts.md)") in out
    assert f"resume this run: fab train --resume {RUN} (same hosts; your script reloads what it saved there)" in out
    assert "MANIFEST.sha256" not in out and "pushed back" not in out
    Renderer().fetch_reports(RUN, f"/p/runs/{RUN}", [report])
    assert "pushed back if the hosts lost it" in " ".join(capsys.readouterr().out.split())


def test_a_script_runs_summary_has_the_world_size_it_ended_with_and_no_epoch_count(capsys) -> None:  # type: ignore[no-untyped-def]
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.0.0.{i}", nproc=2) for i in (1, 2))
    # Elastic: a fixed run ends at its first loss, and its world size is the launch's (tests/test_summary_partial_runs.py).
    plan = plan_launch(Selection(hosts, Rendezvous("h1", 29400)), LaunchOptions(RUN, elastic=ElasticBounds(1, 2)),
                       {}, "/v/python")
    events = (MembershipEvent(1.0, Change.STARTED, "h1", 2), MembershipEvent(1.1, Change.STARTED, "h2", 4),
              MembershipEvent(5.0, Change.LOST, "h2", 2), MembershipEvent(9.0, Change.FINISHED, "h1", 0))
    outcome = JobOutcome(RUN, JobStatus.SUCCEEDED, 0.0, 10.0,
                         (HostOutcome("h1", 0, Path("h1.log"), ()), HostOutcome("h2", None, Path("h2.log"), ())),
                         events=events)
    summary = build_summary(plan, outcome, None)
    assert (summary.world_size, summary.lost_hosts) == (2, ["h2"])  # not the launch's 4
    assert build_summary(plan, JobOutcome(RUN, JobStatus.FAILED, 0.0, 1.0, ()), None).world_size == 4
    Renderer().job_summary(summary, outcome, "summary.json")
    out = capsys.readouterr().out
    assert "succeeded: world size 2, 10.0 s; metrics: none; summary: summary.json" in " ".join(out.split())


def test_an_elastic_script_runs_failure_says_how_it_resumes() -> None:
    assert script_resume_hint(RUN) == (
        f"resume with fab train --resume {RUN} once enough hosts answer: your script starts again on them and "
        "reloads what it saved under $MESHRUN_RUN_DIR there (docs/scripts.md)")


def test_a_scripts_progress_bars_redraw_every_ten_seconds_unless_the_inventory_says_otherwise() -> None:
    """A tqdm bar's every redraw (10 a second) was a line of train.log and of the controller's log per
    rank; the trainer, which prints its own progress, gets no such variable."""
    from meshrun.deploy.run.plan import Workload, host_env

    script = LaunchOptions(RUN, Workload("train.py"))
    assert ("TQDM_MININTERVAL", "10") in host_env(host(), script, None)
    assert "TQDM_MININTERVAL" not in dict(host_env(host(), LaunchOptions(RUN), None))
    mine = dataclasses.replace(host(), env=(("TQDM_MININTERVAL", "1"),))
    assert dict(host_env(mine, script, None))["TQDM_MININTERVAL"] == "1"
