"""`fab train --resume ID` with no --hosts when the run's hosts are no longer in the inventory
(review day2, finding 10b), and a resume's inventory once the checkout moved (finding 2).

A bare resume takes the record's hosts as if typed to --hosts, so it failed `--hosts: unknown host
'h1' in …; known hosts: h9`: a flag the user never typed, and no way out named. Now the line names the
run, the hosts it ran on, the inventory that lacks them, and `--hosts`. No host is contacted: the run
was attached and its controller is gone, so it is not asked whether it still runs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.agents import members_gone
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import Workload
from tests.clirun import git_project, run_meshrun

RUN = "20261201-000001-aaaa"
H9 = "hosts:\n  h9: {address: 192.0.2.9}\n"


def project_with(parent: Path, inventory: str, recorded: str, hosts: tuple[str, ...] = ("h1",),
                 earlier: tuple[str, ...] = ()) -> Project:
    """A git project with `inventory` as inventory/hosts.yaml and RUN recorded (attached, its controller
    gone) with the inventory path `recorded` and `hosts`."""
    root = git_project(parent)
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yaml").write_text(inventory)
    RunRecord(RUN, recorded, hosts, time.time() - 3600, False, "192.0.2.1:29400", earlier=earlier).save(root / "runs")
    return Project(root, root / "runs")


def resume(project: Project, hosts: str | None = None) -> train_cmd.TrainRequest:
    return train_cmd._with_resumed_defaults(train_cmd.TrainRequest(None, hosts, Workload(), resume=RUN), project,
                                            Renderer())


def test_the_line_names_the_runs_hosts_the_inventory_lacks_and_hosts_as_the_way_out() -> None:
    record = RunRecord(RUN, "inventory/hosts.yaml", ("h1", "h2", "h3"), 1.0, False, "x:1", earlier=("h3",))
    fix, inventory = " no longer has; name the hosts to resume on with --hosts", Path("/p/hosts.yaml")
    assert members_gone(record, ("h2", "h9"), inventory) == f"run {RUN} ran on h1, which /p/hosts.yaml{fix}"
    assert members_gone(record, ("h9",), inventory) == f"run {RUN} ran on h1, h2, which /p/hosts.yaml{fix}"
    assert members_gone(record, ("h1", "h2"), inventory) is None  # h3: an earlier attempt's, not resumed


def test_a_bare_resume_whose_hosts_are_gone_names_the_run_and_hosts(tmp_path: Path) -> None:
    """It was: `--hosts: unknown host 'h1' in …/hosts.yaml; known hosts: h9`."""
    project = project_with(tmp_path, H9, "inventory/hosts.yaml")
    with pytest.raises(InputError) as err:
        resume(project)
    assert str(err.value) == with_path(f"run {RUN} ran on h1, which ", project.root / "inventory" / "hosts.yaml",
                                       " no longer has; name the hosts to resume on with --hosts")
    # Hosts typed: resumed there, with the record's inventory from this checkout's root.
    resumed = resume(project, "h9")
    assert (resumed.hosts, resumed.inventory) == ("h9", str(project.root / "inventory" / "hosts.yaml"))


def test_the_cli_says_it_in_one_line_before_any_host(tmp_path: Path) -> None:
    project = project_with(tmp_path, H9, "inventory/hosts.yaml")
    done = run_meshrun(project.root, "train", "--resume", RUN)
    expected = with_path(f"run {RUN} ran on h1, which ", project.root / "inventory" / "hosts.yaml",
                         " no longer has; name the hosts to resume on with --hosts")
    assert (done.returncode, done.stderr.strip()) == (2, "error: " + expected)


def test_a_resume_in_a_moved_checkout_reads_its_own_inventory_and_names_a_gone_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's relative inventory is this checkout's; an older record's absolute one, gone, is
    the run's one line (`pass --inventory NEW`: train takes it)."""
    monkeypatch.chdir(tmp_path)  # not the project root: the record's path is the root's, not the current folder's
    two = "hosts:\n  h1: {address: 192.0.2.1}\n"
    relative = project_with(tmp_path / "a", two, "inventory/hosts.yaml")
    moved = Project(Path(shutil.move(relative.root, tmp_path / "a" / "proj-v2")), tmp_path / "a" / "proj-v2" / "runs")
    resumed = resume(moved)
    assert (resumed.hosts, resumed.inventory) == ("h1", str(moved.root / "inventory" / "hosts.yaml"))
    gone = tmp_path / "b" / "proj" / "inventory" / "hosts.yaml"
    absolute = project_with(tmp_path / "b", two, str(gone))
    shutil.move(absolute.root, tmp_path / "b" / "proj-v2")
    with pytest.raises(InputError) as err:
        resume(Project(tmp_path / "b" / "proj-v2", tmp_path / "b" / "proj-v2" / "runs"))
    assert str(err.value) == with_path(f"run {RUN} was started with inventory ", gone,
                                       ", which is gone; put it back or pass --inventory NEW")
    typed = train_cmd._with_resumed_defaults(
        train_cmd.TrainRequest("b/proj-v2/inventory/hosts.yaml", None, Workload(), resume=RUN),
        Project(tmp_path / "b" / "proj-v2", tmp_path / "b" / "proj-v2" / "runs"), Renderer())
    assert (typed.hosts, typed.inventory) == ("h1", "b/proj-v2/inventory/hosts.yaml")  # as typed, from here
