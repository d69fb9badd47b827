"""A checkout moved, renamed or cloned elsewhere keeps its runs (review day2, finding 2).

launch.json pinned the inventory's absolute path: after `mv proj proj-v2`, `fab status` showed every run
`not asked`, and logs, stop, fetch-checkpoints, join and leave refused with `pass --inventory PATH / set
MESHRUN_INVENTORY`, which those tasks neither took nor read: a detached run still running could not be
stopped. Now an inventory inside the project is recorded relative to its root and read against the
root of the checkout it is in; an older record's absolute path still loads, and when it is gone the
line names the run and `--inventory`, which these tasks take and which overrides the record's.

The run's one host, h1, is this machine (`address: local`, workdir `w1` inside the project): the real
agent answers from the moved checkout's `w1/`, where the run left its files. The record is written by
`fab train`'s own `_record` (no run is started)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.records import RunRecord, load_record, stored_inventory
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import Workload
from meshrun.layout import AGENT_PIDFILE, EXIT_RECORD, LAUNCH_RECORD, host_dir, log_path
from tests.clirun import git_project, run_meshrun

RUN = "20261201-000001-aaaa"
LOCAL = "hosts:\n  h1:\n    address: local\n    workdir: w1\n"
LOG_LINE = "[h1:0] epoch 1/1 done"


def checkout(parent: Path, name: str = "proj") -> Path:
    """A project whose inventory/hosts.yaml lists h1, and run RUN's files on h1 as its agent leaves them
    once the run exited 0 (its log too); no record yet."""
    root = git_project(parent, name)
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yaml").write_text(LOCAL)
    folder = root / "w1" / host_dir(RUN, "h1")
    folder.mkdir(parents=True)
    (folder / AGENT_PIDFILE).write_text(json.dumps({"run_id": RUN, "host": "h1", "agent_pid": 1, "pgid": 1,
                                                    "started": 1000.0, "detached": True}))
    (folder / EXIT_RECORD).write_text(json.dumps({"rc": 0, "reason": "exited", "ended": 1060.0}))
    (root / "w1" / log_path(RUN, "h1")).write_text(LOG_LINE + "\n")
    return root


def train_records(root: Path) -> RunRecord:
    """launch.json as `fab train --detach` writes it for RUN on h1 (train._record; nothing launched)."""
    inventory = load_inventory(root / "inventory" / "hosts.yaml", root)
    request = train_cmd.TrainRequest(None, None, Workload(), detach=True, pg_timeout_s=60)
    options = SimpleNamespace(run_id=RUN, elastic=None, rendezvous_id=RUN, workload=Workload())
    return train_cmd._record(request, inventory, inventory.hosts, SimpleNamespace(rdzv_endpoint="standalone"),
                             options, Project(root, root / "runs"), Renderer())


def old_record(root: Path, elastic: tuple[int, int] | None = None) -> RunRecord:
    """RUN's record as every meshrun before this wrote it: the inventory's absolute path."""
    record = RunRecord(RUN, str(root / "inventory" / "hosts.yaml"), ("h1",), time.time(), True, "standalone",
                       RUN, elastic)
    record.save(root / "runs")
    return record


def moved(root: Path) -> Path:
    """`mv proj proj-v2`."""
    return Path(shutil.move(root, root.with_name(root.name + "-v2")))


def states(cwd: Path, *flags: str) -> list[tuple[str, str, str]]:
    done = run_meshrun(cwd, "status", "--json", *flags)
    assert done.returncode == 0, done.stderr
    return [(s["host"], s["state"], s["detail"]) for s in json.loads(done.stdout)]


def gone_line(root: Path) -> str:
    """What a task says of RUN's old record once `root` (where it was started) has moved."""
    return "error: " + with_path(f"run {RUN} was started with inventory ", root / "inventory" / "hosts.yaml",
                                 ", which is gone; put it back or pass --inventory NEW")


def test_the_record_names_an_inventory_inside_the_project_from_its_root_and_one_outside_in_full(
        tmp_path: Path) -> None:
    root = git_project(tmp_path)
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yaml").write_text(LOCAL)
    (tmp_path / "lab.yaml").write_text(LOCAL)
    assert stored_inventory(root / "inventory" / "hosts.yaml", root) == "inventory/hosts.yaml"
    assert stored_inventory(root / "inventory" / ".." / "inventory" / "hosts.yaml", root) == "inventory/hosts.yaml"
    assert stored_inventory(tmp_path / "lab.yaml", root) == str((tmp_path / "lab.yaml").resolve())
    # The project's path through a symlink (a home folder that is one) is still inside it.
    (tmp_path / "link").symlink_to(root)
    assert stored_inventory(tmp_path / "link" / "inventory" / "hosts.yaml", root) == "inventory/hosts.yaml"


def test_a_relative_record_is_read_against_this_checkouts_root_and_an_absolute_one_as_is(tmp_path: Path) -> None:
    relative = RunRecord(RUN, "inventory/hosts.yaml", ("h1",), 1.0, True, "standalone")
    assert agents.inventory_of(relative, tmp_path / "proj-v2") == tmp_path / "proj-v2" / "inventory" / "hosts.yaml"
    absolute = RunRecord(RUN, "/etc/lab/hosts.yaml", ("h1",), 1.0, True, "standalone")
    assert agents.inventory_of(absolute, tmp_path / "proj-v2") == Path("/etc/lab/hosts.yaml")


def test_a_run_recorded_by_train_is_still_reached_after_the_checkout_moved(tmp_path: Path) -> None:
    """It was: h1 `unknown`, `not asked: …/proj/inventory/hosts.yaml: inventory file not found`; stop rc 2."""
    root = checkout(tmp_path)
    train_records(root)
    assert json.loads((root / "runs" / RUN / LAUNCH_RECORD).read_text())["inventory"] == "inventory/hosts.yaml"
    root = moved(root)
    assert states(root) == [("h1", "exited", "exited")]
    assert states(root / "w1", "--run", RUN) == [("h1", "exited", "exited")]  # from a folder below the root too
    logs = run_meshrun(root, "logs", "--run", RUN)
    assert (logs.returncode, logs.stdout.splitlines()[-1]) == (0, LOG_LINE), logs.stderr
    stop = run_meshrun(root, "stop", "--run", RUN)
    assert stop.returncode == 0 and "gone" not in stop.stderr, stop.stderr
    # A clone elsewhere (the runs folder copied along) reads its own inventory.
    clone = tmp_path / "elsewhere" / "clone"
    shutil.copytree(root, clone, symlinks=True)
    assert states(clone, "--run", RUN) == [("h1", "exited", "exited")]


def test_an_older_records_gone_inventory_is_one_line_naming_the_run_and_inventory_overrides_it(
        tmp_path: Path) -> None:
    """An older record's absolute path still loads; once it is gone, every task says so in the words
    asked for, and `--inventory` (which these tasks did not take) reaches the run's hosts."""
    first = checkout(tmp_path)
    old_record(first)
    root = moved(first)
    assert load_record(root / "runs", RUN).inventory == str(first / "inventory" / "hosts.yaml")
    assert states(root) == [("h1", "unknown", "not asked: " + gone_line(first).removeprefix("error: "))]
    for task in ("logs", "stop", "fetch-checkpoints"):
        done = run_meshrun(root, task, "--run", RUN)
        assert (done.returncode, done.stderr.strip()) == (2, gone_line(first)), task
    here = ("--inventory", "inventory/hosts.yaml")
    assert states(root, *here) == [("h1", "exited", "exited")]
    assert states(root, "--run", RUN, "-i", "inventory/hosts.yaml") == [("h1", "exited", "exited")]
    logs = run_meshrun(root, "logs", "--run", RUN, *here)
    assert (logs.returncode, logs.stdout.splitlines()[-1]) == (0, LOG_LINE), logs.stderr
    fetched = run_meshrun(root, "fetch-checkpoints", "--run", RUN, *here)
    assert fetched.returncode == 0, fetched.stderr
    assert (root / "runs" / RUN / "hosts" / "h1" / "hosts" / "h1" / "train.log").read_text() == LOG_LINE + "\n"
    stop = run_meshrun(root, "stop", *here)  # no --run: the one run that may still be running
    assert stop.returncode == 0, stop.stderr
    assert load_record(root / "runs", RUN).inventory == str(first / "inventory" / "hosts.yaml")  # never rewritten


def test_an_inventory_given_that_names_none_of_the_runs_hosts_is_refused_in_one_line(tmp_path: Path) -> None:
    first = checkout(tmp_path)
    old_record(first)
    root = moved(first)
    (root / "inventory" / "other.yaml").write_text("hosts:\n  h9:\n    address: local\n    workdir: w1\n")
    expected = (f"error: --inventory inventory/other.yaml: names none of run {RUN}'s hosts (h1); pass the "
                "inventory that names them")
    for task in ("logs", "stop", "fetch-checkpoints"):
        done = run_meshrun(root, task, "--run", RUN, "--inventory", "inventory/other.yaml")
        assert (done.returncode, done.stderr.strip()) == (2, expected), task
    assert states(root, "--inventory", "inventory/other.yaml") == [
        ("h1", "unknown", "not asked: " + expected.removeprefix("error: "))]


def test_the_inventory_given_is_this_commands_alone(tmp_path: Path) -> None:
    """Set around one task by deploy/tasks.py: nothing of it is left after the task, even when it fails."""
    (tmp_path / "lab.yaml").write_text("hosts:\n  h9: {address: 192.0.2.9}\n")
    record = RunRecord(RUN, str(tmp_path / "gone.yaml"), ("h1",), 1.0, True, "standalone")
    with pytest.raises(InputError, match="names none of"), agents.inventory_given(str(tmp_path / "lab.yaml")):
        agents.load_run_inventory(record, tmp_path)
    with pytest.raises(InputError, match="which is gone; put it back or pass --inventory NEW"):
        agents.load_run_inventory(record, tmp_path)


@pytest.mark.parametrize("action", ["leave", "join"])
def test_join_and_leave_name_the_gone_inventory_and_take_another(tmp_path: Path, action: str) -> None:
    """An elastic run's older record whose inventory is gone: join and leave named `--inventory`, and
    refused it. Given, a leave reaches h1 (ended there: nothing to leave); a join's start is not tried."""
    first = checkout(tmp_path)
    old_record(first, elastic=(1, 2))
    root = moved(first)
    done = run_meshrun(root, action, "--run", RUN, "--hosts", "h1")
    assert (done.returncode, done.stderr.strip()) == (2, gone_line(first))
    if action == "leave":
        done = run_meshrun(root, action, "--run", RUN, "--hosts", "h1", "--inventory", "inventory/hosts.yaml")
        assert (done.returncode, done.stderr.strip()) == (1, f"error: host 'h1' is not running in run {RUN}")
