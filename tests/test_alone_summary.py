"""A --script run whose ranks never call init_process_group ends with a warning and summary.json's
`trained_alone` (deploy/run/alone.py): read from the controller's copies of the hosts' logs, each
host's word about its own ranks only."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pytest

from meshrun.layout import ALONE_LINE
from meshrun.deploy.run.alone import ALONE_MAX, AloneRank, alone_in_log, alone_warning, trained_alone
from meshrun.deploy.commands.report import logged_alone, script_outcome, script_run_lines
from tests.clirun import git_project, run_meshrun
from tests.fabrun import run_id_of, run_processes

REPO = Path(__file__).resolve().parents[1]


def line(prefix: str, rank: int, world: int) -> str:
    return f"[{prefix}] " + ALONE_LINE.format(rank=rank, world=world)


def test_whole_lines_of_the_runner_count_for_the_log_they_are_in() -> None:
    text = "\n".join([
        "ave alone (docs/scripts.md, \"Scripts written for mp.spawn\")",  # the cut first line of a log's end
        line("gpu1:1", 1, 4),
        line("gpu1:1", 1, 4),  # once
        line("gpu9:3", 3, 4),  # another host's prefix: still this log's host's word
        "[gpu1:0] " + line("gpu1:0", 0, 4),  # the line inside another: no whole line of the runner's
        line("gpu1:2", 2, 4) + " and more",
        line("gpu1:5", 5, 4),  # rank past the world
        line("gpu1:2", 2, 4).replace("2 of 4", "\u0662 of 4"),  # an Arabic-Indic two: no ASCII digit
        ALONE_LINE.format(rank=0, world=4),  # no torchrun prefix
        line("gpu1:0", 0, 4),
    ])
    assert alone_in_log("gpu1", text) == [AloneRank("gpu1", 0, 4), AloneRank("gpu1", 1, 4), AloneRank("gpu1", 3, 4)]
    assert alone_in_log("gpu1", "[gpu1:0] trained on my own\n") == []


def test_a_flooding_host_names_at_most_alone_max_ranks_and_hosts_come_in_order() -> None:
    flood = "\n".join(line("h:0", r, 10**6) for r in range(ALONE_MAX + 50))
    assert len(alone_in_log("h", flood)) == ALONE_MAX
    logs = {"b": line("b:1", 1, 2), "a": line("a:0", 0, 2) + "\n" + line("a:0", 0, 2)}
    assert trained_alone(logs) == [AloneRank("a", 0, 2), AloneRank("b", 1, 2)]
    assert dataclasses.asdict(AloneRank("a", 0, 2)) == {"host": "a", "rank": 0, "world_size": 2}


def test_the_warning_names_the_ranks_and_what_to_do() -> None:
    assert alone_warning([]) is None
    assert alone_warning([AloneRank("a", 0, 2), AloneRank("b", 1, 2)]) == (
        "2 rank(s) never called torch.distributed.init_process_group and trained alone (a rank 0, b rank 1): each "
        "trained the whole job by itself, so the run's result is no distributed one; pass your script its "
        'distribution flags (docs/scripts.md, "Scripts written for mp.spawn")')
    many = alone_warning([AloneRank("h", r, 10) for r in range(10)])
    assert many is not None and many.startswith("10 rank(s) ") and "h rank 7 and 2 more)" in many


def test_fab_report_of_a_script_run_shows_the_ranks_that_trained_alone() -> None:
    """`fab report` reads `trained_alone` back from summary.json, the entries of the controller's
    shape only (the file may have been edited), host names shown neutralized."""
    summary = {"run_id": "r1", "status": "succeeded", "world_size": 2, "host_results": {"a": {"rc": 0}},
               "trained_alone": [{"host": "a", "rank": 1, "world_size": 2}, {"host": "a", "rank": 2, "world_size": 2},
                                 {"host": ["a"], "rank": 0, "world_size": 2}, "a rank 0",
                                 {"host": "b\x1b[2J", "rank": 0, "world_size": 2}]}
    outcome = script_outcome(summary)
    assert outcome.trained_alone == [{"host": "a", "rank": 1, "world_size": 2},
                                     {"host": "b\x1b[2J", "rank": 0, "world_size": 2}]
    assert script_run_lines("r1", "train.py", outcome, ("a",))[2:] == [
        "2 rank(s) never called torch.distributed.init_process_group and trained alone (a rank 1, b\\x1b[2J rank 0): "
        "each trained the whole job by itself, so the run's result is no distributed one; pass your script its "
        'distribution flags (docs/scripts.md, "Scripts written for mp.spawn")']
    assert script_outcome({**summary, "trained_alone": "all"}).trained_alone == []
    assert len(script_run_lines("r1", "train.py", script_outcome({**summary, "trained_alone": []}), ("a",))) == 2


def _alone_project(tmp_path: Path) -> Path:
    """A git project on the bundled local inventory (2 processes) whose script imports no torch."""
    project = git_project(tmp_path)
    (project / "alone.py").write_text("print('trained on my own')\n")
    (project / "inventory").mkdir()
    (project / "inventory" / "local.yaml").write_bytes((REPO / "inventory" / "local.yaml").read_bytes())
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    return project


@pytest.mark.slow
def test_a_local_script_run_that_never_joins_says_so_at_its_end_and_in_its_summary(tmp_path: Path) -> None:
    """Real torchrun and runner on the bundled local inventory (2 processes): the script imports no torch."""
    project = _alone_project(tmp_path)
    done = run_meshrun(project, "train", "--script", "alone.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ("warning: 2 rank(s) never called torch.distributed.init_process_group and trained alone (local rank 0, "
            "local rank 1): ") in " ".join(done.stderr.split())
    [summary_path] = (project / "runs").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "succeeded"
    assert summary["trained_alone"] == [{"host": "local", "rank": 0, "world_size": 2},
                                        {"host": "local", "rank": 1, "world_size": 2}]


def test_fab_report_of_a_run_without_a_summary_reads_the_hosts_logs_here(tmp_path: Path) -> None:
    """A detached run has no summary.json: `fab report` reads the ends of the hosts' agent logs that
    `fab fetch-checkpoints` brought (a remote host's under its tree, a local host's where the run
    lives), each for its own host only; a script's own train.log in its run directory counts for its
    host too, and names no other."""
    home = tmp_path / "r1"
    fetched = home / "hosts/gpu1/hosts/gpu1/train.log"
    fetched.parent.mkdir(parents=True)
    fetched.write_text("\n".join(["started", line("gpu1:0", 0, 3), line("gpu2:1", 1, 3), ""]))
    local = home / "hosts/local/train.log"
    local.parent.mkdir(parents=True)
    local.write_text(line("local:2", 2, 3) + "\n")
    (home / "hosts/gpu2").mkdir()
    (home / "hosts/gpu2/train.log").write_text(line("gpu1:0", 1, 3) + "\n")  # the script's own file on gpu2
    assert logged_alone(home, ("gpu1", "gpu2", "local")) == [AloneRank("gpu1", 0, 3), AloneRank("gpu1", 1, 3),
                                                             AloneRank("gpu2", 1, 3), AloneRank("local", 2, 3)]
    assert logged_alone(home, ("gpu3",)) == []
    outcome = dataclasses.replace(script_outcome(None), trained_alone=[dataclasses.asdict(r) for r in
                                                                       logged_alone(home, ("local",))])
    assert script_run_lines("r1", "alone.py", outcome, ("local",))[2:] == [
        "from the hosts' logs here: 1 rank(s) never called torch.distributed.init_process_group and trained alone "
        "(local rank 2): each trained the whole job by itself, so the run's result is no distributed one; pass your "
        'script its distribution flags (docs/scripts.md, "Scripts written for mp.spawn")']


@pytest.mark.slow
def test_a_detached_local_script_run_that_never_joins_is_named_by_fab_report(tmp_path: Path) -> None:
    """Real torchrun, agent and runner, detached, on the bundled local inventory (2 processes)."""
    project = _alone_project(tmp_path)
    started = run_meshrun(project, "train", "--detach", "--script", "alone.py")
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    run_id = run_id_of(started.stdout)
    deadline = time.monotonic() + 120
    while run_processes(run_id) or not (project / "runs" / run_id / "hosts/local/exit.json").exists():
        assert time.monotonic() < deadline, "the detached run did not end"
        time.sleep(0.5)
    report = run_meshrun(project, "report", "--run", run_id, "--json")
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert json.loads(report.stdout)["trained_alone"] == [{"host": "local", "rank": 0, "world_size": 2},
                                                          {"host": "local", "rank": 1, "world_size": 2}]
    said = " ".join(run_meshrun(project, "report", "--run", run_id).stdout.split())
    assert ("from the hosts' logs here: 2 rank(s) never called torch.distributed.init_process_group and trained "
            "alone (local rank 0, local rank 1): ") in said, said
