"""`fab leave` of a host that did not answer says so (deploy/commands/joincheck.py `leave_refusal`).

A detached elastic run on Monday: gpu3 stopped answering, maybe still training and holding its GPU.
`fab leave --hosts gpu3` answered `host 'gpu3' is not running in run X`, a state meshrun does not know,
and said nothing of what to do. The real `membership.main` runs; the hosts' states are stood in for,
and the stop must not be sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.commands import membership
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.run.hoststate import HostState
from tests.memberproject import member_project

RUN = "20261204-100000-bbbb"

@pytest.fixture
def project(tmp_path: Path) -> Project:
    project = member_project(tmp_path, "g1", "g2", "g3")
    RunRecord(RUN, str(tmp_path / "inv.yaml"), ("g1", "g2", "g3"), 1.0, True, "10.0.0.1:29500", RUN,
              (1, 3)).save(project.runs)
    return project


def leave_g3(project: Project, monkeypatch: pytest.MonkeyPatch, g3: HostState) -> tuple[str, list]:
    """`fab leave --hosts g3` with g1 and g2 running: its error, and the stops sent."""
    stops: list = []
    monkeypatch.setattr(agents, "host_states", lambda record, root: [
        HostState(RUN, "g1", "running"), HostState(RUN, "g2", "running"), g3])
    monkeypatch.setattr(agents, "stop_hosts", lambda *args: stops.append(args))
    with pytest.raises(MeshrunError) as info:
        membership.main("leave", RUN, "g3", project)
    return str(info.value), stops


@pytest.mark.parametrize("g3,why", [
    (HostState(RUN, "g3", "unreachable", detail="host 'g3': connection timed out"), "connection timed out"),
    (HostState(RUN, "g3", "stuck", detail="host 'g3': the agent's status did not finish within 20 s"),
     "the agent's status did not finish within 20 s"),
    (HostState(RUN, "g3", "unknown", detail="the agent's answer is not JSON: 'Segmentation fault'"),
     "the agent's answer is not JSON: 'Segmentation fault'"),
    (HostState(RUN, "g3", "unknown", detail="bash: line 1:\n\x1b[31mpython: not found"),  # a host's stderr
     "bash: line 1:\\n\\x1b[31mpython: not found"),
    (HostState(RUN, "g3", "unknown"), "unknown"),
])
def test_a_leave_of_a_host_that_did_not_answer_says_so(project: Project, monkeypatch: pytest.MonkeyPatch,
                                                       g3: HostState, why: str) -> None:
    message, stops = leave_g3(project, monkeypatch, g3)
    assert message == (f"host 'g3' did not answer ({why}); whether it still runs in run {RUN} is not known; "
                       f"leave it again once it answers, or end the whole run with fab stop --run {RUN}")
    assert "is not running" not in message and stops == []


@pytest.mark.parametrize("g3", [HostState(RUN, "g3", "exited", rc=0), HostState(RUN, "g3", "stopped", rc=143),
                                HostState(RUN, "g3", "unknown", detail="the agent does not know this run")])
def test_a_leave_of_a_host_whose_agent_said_it_is_not_running_says_that(project: Project,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        g3: HostState) -> None:
    """Its agent answered: the run ended there, or never ran there."""
    assert leave_g3(project, monkeypatch, g3) == (f"host 'g3' is not running in run {RUN}", [])
