"""`fab join` into a run that has ended is refused before any host is changed
(deploy/commands/joincheck.py, deploy/commands/membership.py).

A join of Friday's run on Monday printed `started detached on g3`, exited 0 and added g3 to
launch.json: the run's store was long gone, so the joiner's torchrun waited for a rendezvous that never
came. On a former member the new agent first deleted that host's exit.json and result.json, the
finished run's final metrics. An attached run that ended has its controller's summary.json; a
detached one has none, and its members' agents say it is over. The real `membership.main` runs; only
what needs an SSH host is stood in for (the hosts' states, preparing the joiner, the agent's start)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from meshrun.deploy.commands import membership
from meshrun.deploy.commands.joincheck import members_end
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.agents import load_run_inventory
from meshrun.deploy.edges.records import RunRecord, load_record
from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.hoststate import HostState
from tests.memberproject import StoodIn, member_project

RUN = "20261204-100000-aaaa"

@pytest.fixture
def project(tmp_path: Path) -> Project:
    return member_project(tmp_path, "g1", "g2", "g3")


def saved(project: Project, detached: bool) -> RunRecord:
    record = RunRecord(RUN, str(project.root / "inv.yaml"), ("g1", "g2"), 1.0, detached, "10.0.0.1:29500", RUN,
                       (1, 3))
    record.save(project.runs)
    return record


def Hosts(monkeypatch: pytest.MonkeyPatch, states: dict[str, HostState]) -> StoodIn:  # noqa: N802 (was a class)
    """`states`: what each host's agent answers about the run; a host not in it does not know the run."""
    return StoodIn(monkeypatch, lambda record: [
        states.get(h, HostState(RUN, h, "unknown", detail="the agent does not know this run")) for h in record.hosts])


def state(host: str, name: str, rc: int | None = None) -> HostState:
    return HostState(RUN, host, name, rc=rc, generation=0)


def launch_json(project: Project) -> bytes:
    return (project.runs / RUN / "launch.json").read_bytes()


def test_a_join_into_a_run_with_its_controllers_summary_is_refused_before_any_host(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Friday's attached run ended (`succeeded`) and its controller is gone: no host is even asked."""
    hosts = Hosts(monkeypatch, {h: state(h, "exited", 0) for h in ("g1", "g2")})
    saved(project, detached=False)
    (project.runs / RUN / "summary.json").write_text(json.dumps({"run_id": RUN, "status": "succeeded"}))
    before = launch_json(project)
    with pytest.raises(InputError) as info:
        membership.main("join", RUN, "g3", project)
    assert str(info.value) == (f"run {RUN} has ended (succeeded); nothing started. Continue it with "
                               f"fab train --resume {RUN} --hosts g1,g2,g3")
    assert (hosts.asked, hosts.prepared, hosts.started) == ([], [], [])
    assert launch_json(project) == before


def test_a_script_s_summary_json_is_no_end_of_the_run(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of that name a script wrote, or a resumed run's retired one, does not end the run."""
    hosts = Hosts(monkeypatch, {"g1": state("g1", "running"), "g2": state("g2", "running")})
    saved(project, detached=True)
    (project.runs / RUN / "summary.json").write_text(json.dumps({"best_loss": 0.33}))
    (project.runs / RUN / "summary.prev.json").write_text(json.dumps({"run_id": RUN, "status": "stopped"}))
    membership.main("join", RUN, "g3", project)
    assert hosts.started == ["g3"] and load_record(project.runs, RUN).hosts == ("g1", "g2", "g3")


@pytest.mark.parametrize("joiner,hosts_after", [("g3", "g1,g2,g3"), ("g2", "g1,g2")])
def test_a_detached_run_none_of_whose_members_runs_is_refused(project: Project, monkeypatch: pytest.MonkeyPatch,
                                                              joiner: str, hosts_after: str) -> None:
    """g2, a former member, is the case that lost data: its new agent deleted its exit.json and result.json."""
    hosts = Hosts(monkeypatch, {"g1": state("g1", "exited", 0), "g2": state("g2", "stopped", 143)})
    saved(project, detached=True)
    before = launch_json(project)
    with pytest.raises(InputError) as info:
        membership.main("join", RUN, joiner, project)
    assert str(info.value) == (f"run {RUN} has ended (g1 exited 0, g2 stopped 143); nothing started. Continue it "
                               f"with fab train --resume {RUN} --hosts {hosts_after}")
    assert (hosts.prepared, hosts.started) == ([], [])
    assert launch_json(project) == before


def test_a_detached_run_whose_member_did_not_answer_may_still_run(project: Project,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether g2 still runs is not known: the join goes on, as before (the joiner finds out)."""
    hosts = Hosts(monkeypatch, {"g1": state("g1", "exited", 0),
                                "g2": HostState(RUN, "g2", "unreachable", detail="host 'g2': timed out")})
    saved(project, detached=True)
    assert membership.join_or_leave(project, load_record(project.runs, RUN), "join", ["g3"],
                                    membership.Renderer()) == ["started detached on g3"]
    assert hosts.started == ["g3"]


def test_members_end_is_said_only_when_every_member_answered_and_none_runs() -> None:
    exited, stopped = state("g1", "exited", 0), state("g2", "stopped", 143)
    knows_not = HostState(RUN, "g2", "unknown", detail="the agent does not know this run")
    garbled = HostState(RUN, "g2", "unknown", detail="the agent's answer is not JSON: 'x'")
    assert members_end(("g1", "g2"), [exited, stopped]) == "g1 exited 0, g2 stopped 143"
    assert members_end(("g1", "g2"), [exited, knows_not]) == "g1 exited 0"  # g2's agent never ran it
    assert members_end(("g1", "g2"), [exited, state("g2", "lost")]) == "g1 exited 0, g2 lost"
    assert members_end(("g1", "g2"), [exited, state("g2", "running")]) is None
    assert members_end(("g1", "g2"), [exited, garbled]) is None  # an answer not read is no answer
    assert members_end(("g1", "g2"), [exited, state("g2", "stuck")]) is None
    assert members_end(("g1", "g2"), [exited]) is None  # g2 not asked
    assert members_end(("g1", "g2"), [knows_not, HostState(RUN, "g1", "unknown", detail=knows_not.detail)]) is None
    assert members_end(("g1",), [exited, state("g3", "running")]) == "g1 exited 0"  # g3 is no member


def test_an_attached_runs_join_refuses_an_inventory_its_controller_does_not_plan_with(project: Project) -> None:
    """The attached controller plans a joiner with the inventory it launched with: a --inventory naming a new
    host was checked here and then answered by the controller as an unknown host of a file never passed."""
    other = project.root / "more.yaml"
    other.write_text("hosts:\n  g1: {address: 10.0.0.1}\n  g9: {address: 10.0.0.9}\n")
    record = RunRecord(RUN, str(project.root / "inv.yaml"), ("g1", "g2"), 1.0, False, "10.0.0.1:29500", RUN, (1, 3),
                       controller_pid=os.getpid())
    record.save(project.runs)
    alive = pytest.MonkeyPatch.context()
    with alive as patched, agents.inventory_given(str(other)), pytest.raises(InputError) as refused:
        patched.setattr(membership, "controller_alive", lambda run: True)  # this test's pid is no `fab train`
        membership.join_or_leave(project, record, "join", ["g9"], Renderer())
    assert str(refused.value) == (
        f"run {RUN} is attached to a fab train that plans with the inventory it was started with: --inventory cannot "
        f"change it; leave it out, or stop the run and resume it on the new inventory (fab train --resume {RUN} "
        "--inventory NEW)")
    assert not membership.requests_dir(project, RUN).exists() or not any(membership.requests_dir(project, RUN).iterdir())


def test_a_detached_join_through_an_inventory_naming_only_some_members_is_one_line(project: Project) -> None:
    """It named g1 (so it passed as this run's) but not g2: the joiner's plan found no g2 (an internal error)."""
    other = project.root / "more.yaml"
    other.write_text("hosts:\n  g1: {address: 10.0.0.1}\n  g9: {address: 10.0.0.9}\n")
    record = saved(project, True)
    with agents.inventory_given(str(other)), pytest.raises(InputError) as refused:
        membership.prepare_joiner(record, load_run_inventory(record, project.root), "g9", project, Renderer(), True)
    assert str(refused.value) == f"run {RUN}'s member(s) g2 are not in {other}; join through an inventory that names every member"
