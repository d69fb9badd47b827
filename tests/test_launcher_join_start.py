"""A join's start inside the attached controller (deploy/edges/launcher.py), from a review.

`add_host` listed the joiner before starting its agent; a start that failed (the joiner's link
dropped, its sshd went away) left the entry, never done, so the job counted it as running and
never ended. And neither `claim` nor `add_host` looked at `stopping`: a join could start an agent
after the controller had stopped every host and said so. Fake sessions stand in for SSH (what is
under test is the launcher's bookkeeping); the agent start is tested on real sshd elsewhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import ElasticBounds, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from tests.fakesession import FakeSession, host


class Unreachable(FakeSession):
    def start(self, argv):  # type: ignore[no-untyped-def,override]
        raise MeshrunError("host 'h2': the SSH connection dropped")


def _runner(tmp_path: Path) -> tuple[JobRunner, object]:
    h1, h2 = host(), dataclasses.replace(host(), name="h2", address="10.147.17.6")
    options = LaunchOptions("r1", elastic=ElasticBounds(1, 3))
    plan = plan_launch(Selection((h1,), Rendezvous("h1", 29400)), options, {}, "/venv/bin/python")
    joining = plan_launch(Selection((h1, h2), Rendezvous("h1", 29400)), options, {}, "/venv/bin/python").hosts[1]
    return JobRunner(plan, {"h1": FakeSession("")}, lambda _h, _l: None, tmp_path, "/venv/bin/python"), joining


def test_a_joiner_whose_start_fails_leaves_no_entry_behind(tmp_path: Path) -> None:
    runner, joining = _runner(tmp_path)
    before = list(runner.hosts)
    assert runner.claim("h2") is None
    with pytest.raises(MeshrunError, match="the SSH connection dropped"):
        runner.add_host(joining, Unreachable("", the_host=joining.host))  # type: ignore[attr-defined]
    assert runner.hosts == before


def test_no_join_starts_once_the_controller_is_stopping(tmp_path: Path) -> None:
    runner, joining = _runner(tmp_path)
    runner.stopping.set()  # stop_all began: every host is being stopped and checked
    assert runner.claim("h2") == "run r1 is ending; host 'h2' not started"
    with pytest.raises(MeshrunError) as info:
        runner.add_host(joining, FakeSession("", the_host=joining.host))  # type: ignore[attr-defined]
    assert str(info.value) == "host 'h2': run r1 is ending; nothing started"
    assert [h.name for h in runner.hosts] == ["h1"]
