"""`fab stop`, `logs` and `status` with no `--run` when an old run's recorded inventory no longer
loads (review stop50-commits, finding 1).

A detached run never gets a summary, so every one ever started is asked about; asking loaded each
record's inventory first, and one renamed, deleted or broken inventory of an old run made the
command fail outright, naming a file the user no longer uses. Now such a run's hosts are `unknown`
(not asked, and why), the other runs are asked as before, and when no run is running the newest is
taken with a warning that names the run that could not be asked.

Host h1 is this machine (`address: local`, the real agent answering from `hostdir/`), as in
tests/test_status_fanout.py; each connect is counted."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from meshrun.deploy.commands import status
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.records import (NOT_ASKED, RunRecord, live_records, not_known, resolve_live_run,
                                          took_newest)
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.project import Project
from meshrun.deploy.run.hoststate import HostState
from meshrun.layout import AGENT_PIDFILE, EXIT_RECORD, host_dir

OLD, NEW = "20261201-000001-aaaa", "20261201-000002-bbbb"
BROKEN = {"deleted": None, "not an inventory": "hosts: 5\n", "not YAML": "hosts: [\n"}


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """OLD, recorded with inventory/old.yaml (made unloadable by each test), and NEW, the newest,
    on this machine with inventory/hosts.yaml: it ran and exited with rc 0."""
    root = tmp_path / "proj"
    (root / "inventory").mkdir(parents=True)
    (root / "hostdir").mkdir()
    local = "hosts:\n  h1:\n    address: local\n    workdir: hostdir\n"
    (root / "inventory" / "hosts.yaml").write_text(local)
    now = time.time()
    RunRecord(OLD, str(root / "inventory" / "old.yaml"), ("gpu1", "gpu2"), now - 3600, True, "192.0.2.1:29400"
              ).save(root / "runs")
    RunRecord(NEW, str(root / "inventory" / "hosts.yaml"), ("h1",), now - 60, True, "127.0.0.1:29400"
              ).save(root / "runs")
    folder = root / "hostdir" / host_dir(NEW, "h1")
    folder.mkdir(parents=True)
    (folder / AGENT_PIDFILE).write_text(json.dumps({"run_id": NEW, "host": "h1", "agent_pid": 1, "pgid": 1,
                                                    "started": 1000.0, "detached": True}))
    (folder / EXIT_RECORD).write_text(json.dumps({"rc": 0, "reason": "exited", "ended": 1060.0}))
    return Project(root, root / "runs")


def break_old(project: Project, how: str) -> str:
    """OLD's inventory made unloadable `how`; the one-line error loading it gives."""
    path = project.root / "inventory" / "old.yaml"
    if BROKEN[how] is None:  # deleted: the run's own line, naming --inventory (agents.recorded_inventory)
        return with_path(f"run {OLD} was started with inventory ", path, ", which is gone; put it back or pass "
                         "--inventory NEW")
    path.write_text(BROKEN[how])
    from meshrun.deploy.inventory.load import load_inventory

    with pytest.raises(MeshrunError) as err:
        load_inventory(path, project.root)
    return " ".join(str(err.value).splitlines())


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Counter:
    made: Counter = Counter()
    real = agents.connect

    def connect(host: Host, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        made[host.name] += 1
        return real(host, *args, **kwargs)

    monkeypatch.setattr(agents, "connect", connect)
    return made


NEW_EXITED = HostState(NEW, "h1", "exited", rc=0, uptime_s=60.0, detail="exited", generation=0)


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_run_whose_inventory_does_not_load_is_unknown_and_the_others_are_asked(
        project: Project, connects: Counter, how: str) -> None:
    why = break_old(project, how)
    states = agents.run_states(live_records(project.runs), project.root)
    assert states == [NEW_EXITED,
                      HostState(OLD, "gpu1", "unknown", detail=NOT_ASKED + why),
                      HostState(OLD, "gpu2", "unknown", detail=NOT_ASKED + why)]
    assert connects == Counter({"h1": 1})  # the unresolvable run's hosts are never dialled


def test_stop_and_logs_take_the_newest_and_name_the_run_not_asked(project: Project, connects: Counter) -> None:
    """It was: InputError `…/inventory/old.yaml: inventory file not found; …`, and nothing stopped."""
    why = break_old(project, "deleted")
    warned: list[str] = []
    chosen = resolve_live_run(project.runs, None, "fab stop", warned.append,
                              lambda live: agents.run_states(live, project.root))
    assert chosen.run_id == NEW
    what = why.split("; ")[0]
    assert what.endswith("old.yaml, which is gone")
    assert warned == [f"no host says a run is running, so fab stop takes the newest, {NEW}; whether these still "
                      f"run is not known: {OLD} ({what}); name one: fab stop --run ID"]


def test_status_shows_why_a_run_was_not_asked(project: Project, connects: Counter,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    why = break_old(project, "not an inventory")
    status.main(None, True, project)
    shown = json.loads(capsys.readouterr().out)
    assert [(s["run_id"], s["host"], s["state"], s["detail"]) for s in shown] == [
        (NEW, "h1", "exited", "exited"), (OLD, "gpu1", "unknown", NOT_ASKED + why),
        (OLD, "gpu2", "unknown", NOT_ASKED + why)]


def test_one_run_asked_by_name_still_fails_on_its_inventory(project: Project) -> None:
    """`--resume`, join and leave decide from host_states whether a run still runs: "not asked"
    must not read as "not running" there, so its inventory's error is raised as before."""
    why = break_old(project, "deleted")
    old = next(r for r in live_records(project.runs) if r.run_id == OLD)
    with pytest.raises(InputError) as err:
        agents.host_states(old, project.root)
    assert str(err.value) == why


def test_a_run_running_is_taken_and_several_running_are_still_refused(project: Project) -> None:
    """The hosts' answers decide as before; a run not asked is never taken as running."""
    def ask(running: tuple[str, ...]):  # type: ignore[no-untyped-def]
        return lambda live: [HostState(r.run_id, r.hosts[0], "running" if r.run_id in running
                                       else "unknown", detail=None if r.run_id in running else NOT_ASKED + "x")
                             for r in live]

    warned: list[str] = []
    assert resolve_live_run(project.runs, None, "fab logs", warned.append, ask((OLD,))).run_id == OLD
    assert warned == []
    with pytest.raises(InputError, match=f"^2 runs may still be running: {NEW} \\(h1\\), {OLD} "):
        resolve_live_run(project.runs, None, "fab logs", warned.append, ask((OLD, NEW)))


def test_only_runs_no_host_of_which_answered_are_not_known() -> None:
    """An agent that does not know the run answered (a detached start that failed leaves such a
    record); unreachable, stuck and not asked did not; one answer from any host is an answer."""
    records = [RunRecord(f"r{n}", "/inv.yaml", ("a", "b"), float(n), True, "e") for n in range(5)]
    states = [HostState("r0", "a", "unknown", detail="the agent does not know this run"),
              HostState("r0", "b", "unreachable", detail="host 'b': cannot connect"),
              HostState("r1", "a", "unreachable", detail="host 'a': cannot connect; is sshd running?"),
              HostState("r1", "b", "stuck", detail="host 'b': no answer"),
              HostState("r2", "a", "unknown", detail=NOT_ASKED + "/inv.yaml: inventory file not found; create it"),
              HostState("r2", "b", "unknown", detail=NOT_ASKED + "/inv.yaml: inventory file not found; create it"),
              HostState("r3", "a", "exited", rc=0), HostState("r3", "b", "unreachable")]
    unknown = not_known(records, states)  # r4: not asked at all (not in `states`): nothing to say of it
    assert unknown == [(records[1], "host 'a': cannot connect; is sshd running?"),
                       (records[2], "/inv.yaml: inventory file not found; create it")]
    assert took_newest(records[4], unknown, "fab logs") == (
        "no host says a run is running, so fab logs takes the newest, r4; whether these still run is not known: "
        "r1 (host 'a': cannot connect), r2 (/inv.yaml: inventory file not found); "
        "name one: fab logs --run ID")
