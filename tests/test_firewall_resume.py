"""`fab train --resume ID --firewall` (a review of this session's commits, finding 2).

The bracket went up with the command line's `--inventory`/`--hosts` as given: a bare resume raised
the chain on every host of the default inventory, not the run's, and a resume whose `--hosts` left
out the inventory's `rendezvous.host` (it died: the documented recovery) was refused by the
firewall's own selection before anything ran. The bracket now takes the resume's hosts from the run
record and moves the rendezvous as the resume does. The host-side firewall runs (iptables on each
host, over SSH) are replaced by a recorder that reads the selection's head as the real `apply` does;
the inventory, run record and selection are real."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrun.deploy.commands import firewall
from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project
from meshrun.deploy.run.plan import Workload

RUN = "20260101-000000-f00d"
RAN = 3  # the stand-in run's exit status: main passes it on, bracketed
INVENTORY = ("hosts:\n  h1: {address: 10.0.0.1}\n  h2: {address: 10.0.0.2}\n  h3: {address: 10.0.0.3}\n"
             "  h4: {address: 10.0.0.4}\nrendezvous: {host: h1}\n")


@pytest.fixture
def applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...], str]]:
    log: list[tuple[str, tuple[str, ...], str]] = []

    def apply(action, selection, sessions):  # type: ignore[no-untyped-def]
        log.append((action.value, tuple(h.name for h in selection.hosts), selection.head.name))
        return {}

    @contextlib.contextmanager
    def sessions_to(hosts, inventory, root):  # type: ignore[no-untyped-def]
        yield {h.name: SimpleNamespace() for h in hosts}

    monkeypatch.setattr(firewall, "apply", apply)
    monkeypatch.setattr(firewall, "sessions_to", sessions_to)
    monkeypatch.setattr(train_cmd, "train", lambda request, renderer, project: RAN)  # the run itself: not here
    return log


def _project(tmp_path: Path) -> Project:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "lab.yaml"), ("h1", "h2", "h3"), time.time() - 60, False, "10.0.0.1:29400",
              controller_pid=None, firewall=True).save(project.runs)
    return project


def test_a_resume_without_the_rendezvous_host_is_bracketed_on_its_own_hosts(tmp_path: Path, applied: list) -> None:
    project = _project(tmp_path)
    request = train_cmd.TrainRequest(None, "h2,h3", Workload(), resume=RUN, firewall=True)
    assert train_cmd.main(request, project) == RAN
    assert applied == [("up", ("h2", "h3"), "h2"), ("down", ("h2", "h3"), "h2")]


def test_a_bare_resume_is_bracketed_on_the_records_members_from_its_inventory(tmp_path: Path,
                                                                              applied: list) -> None:
    """The run's inventory is lab.yaml, not the default one (which does not exist here)."""
    project = _project(tmp_path)
    assert train_cmd.main(train_cmd.TrainRequest(None, None, Workload(), resume=RUN, firewall=True), project) == RAN
    assert applied == [("up", ("h1", "h2", "h3"), "h1"), ("down", ("h1", "h2", "h3"), "h1")]


def test_a_fresh_run_still_refuses_a_selection_without_its_rendezvous_host(tmp_path: Path, applied: list) -> None:
    project = _project(tmp_path)
    request = train_cmd.TrainRequest(str(tmp_path / "lab.yaml"), "h2,h3", Workload(), firewall=True)
    with pytest.raises(InputError) as info:
        train_cmd.main(request, project)
    assert "rendezvous host 'h1' is not among the selected hosts (h2, h3)" in str(info.value)
