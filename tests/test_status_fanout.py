"""`fab status` connects to each distinct host once and asks it once, whatever the number of recorded
runs that name it (findings "stalls", 4): it asked every run's hosts one run after another, so each
detached run kept on a dead host added that host's connect timeout (10 runs: 100-300 s).

Host h1 is this machine (`address: local`, the real agent answering from `hostdir/`); host h2 cannot
be reached (its connect raises, as a dead host's does). Each connect is counted, never timed."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.commands import status
from meshrun.deploy.edges import agents, transport
from meshrun.deploy.edges.sshexec import NotFinished
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host.procs import tagged_pids, tagged_runs
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project
from meshrun.deploy.run.hoststate import HostState, parse_status, parse_statuses
from meshrun.layout import AGENT_PIDFILE, ENV_HOST, ENV_RUN_ID, EXIT_RECORD, host_dir

REPO = Path(__file__).resolve().parents[1]
DEAD = "host 'h2': cannot connect to nobody@127.0.0.1:9 (Connection refused); is sshd running and the port open?"
RUNS = ("20261201-000001-aaaa", "20261201-000002-bbbb", "20261201-000003-cccc", "20261201-000004-dddd")


def write_inventory(root: Path, name: str, h1_workdir: str) -> Path:
    inventory = root / "inventory" / name
    inventory.write_text(f"hosts:\n  h1:\n    address: local\n    workdir: {h1_workdir}\n"
                         "  h2:\n    address: 127.0.0.1\n    port: 9\n    user: nobody\n"
                         "known_hosts: inventory/known_hosts\n")
    return inventory


def ended(workdir: Path, run_id: str, rc: int) -> None:
    """Run `run_id`'s files on h1 as its agent leaves them once the run ended with `rc`."""
    folder = workdir / host_dir(run_id, "h1")
    folder.mkdir(parents=True)
    (folder / AGENT_PIDFILE).write_text(json.dumps({"run_id": run_id, "host": "h1", "agent_pid": 1, "pgid": 1,
                                                    "started": 1000.0, "detached": True}))
    (folder / EXIT_RECORD).write_text(json.dumps({"rc": rc, "reason": "exited", "ended": 1060.0 + rc}))


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    """Four detached runs on h1 and h2, recorded with one inventory: three ended on h1, one never started there."""
    root = tmp_path / "proj"
    (root / "inventory").mkdir(parents=True)
    (root / "inventory" / "known_hosts").write_text("")
    (root / "hostdir").mkdir()
    inventory = write_inventory(root, "hosts.yaml", "hostdir")
    for index, run_id in enumerate(RUNS):
        RunRecord(run_id, str(inventory), ("h1", "h2"), time.time() + index, True, "127.0.0.1:29400").save(root / "runs")
        if index < 3:
            ended(root / "hostdir", run_id, index)
    yield Project(root, root / "runs")


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every connect by host name; h2's fails at once, as a dead host's does (after its timeout)."""
    made: Counter = Counter()
    real = agents.connect

    def connect(host: Host, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        made[host.name] += 1
        if host.name == "h2":
            raise MeshrunError(DEAD)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(agents, "connect", connect)
    return made


def expected_states() -> list[HostState]:
    """Newest run first (live_records' order), each with h1's answer and h2 unreachable."""
    h1 = {RUNS[index]: HostState(RUNS[index], "h1", "exited", rc=index, uptime_s=60.0 + index, detail="exited",
                                     generation=0)
          for index in range(3)}
    h1[RUNS[3]] = HostState(RUNS[3], "h1", "unknown", detail="the agent does not know this run")
    return [state for run_id in reversed(RUNS)
            for state in (h1[run_id], HostState(run_id, "h2", "unreachable", detail=DEAD))]


def test_status_connects_to_each_host_once_whatever_the_number_of_runs(
        project: Project, connects: Counter, capsys: pytest.CaptureFixture[str]) -> None:
    status.main(None, True, project)
    shown = json.loads(capsys.readouterr().out)
    assert connects == Counter({"h1": 1, "h2": 1})  # it was 4 each: one connect per recorded run
    assert [HostState(**{**s, "progress": None}) for s in shown] == expected_states()


def test_asked_once_for_all_runs_the_states_are_those_asked_one_run_at_a_time(
        project: Project, connects: Counter) -> None:
    from meshrun.deploy.edges.records import live_records

    records = live_records(project.runs)
    together = agents.run_states(records, project.root)
    assert connects == Counter({"h1": 1, "h2": 1})
    one_by_one = [state for record in records for state in agents.host_states(record, project.root)]
    assert together == one_by_one == expected_states()


def test_one_name_for_two_hosts_in_two_inventories_is_two_hosts(project: Project, connects: Counter) -> None:
    """A run recorded with another inventory whose h1 has another workdir is asked there, apart."""
    other = project.root / "hostdir2"
    other.mkdir()
    ended(other, "20261201-000005-eeee", 7)
    inventory = write_inventory(project.root, "other.yaml", "hostdir2")
    record = RunRecord("20261201-000005-eeee", str(inventory), ("h1",), time.time() + 9, True, "127.0.0.1:29400")
    from meshrun.deploy.edges.records import load_record

    states = agents.run_states([record, load_record(project.runs, RUNS[0])], project.root)
    assert connects == Counter({"h1": 2, "h2": 1})
    assert states == [HostState(record.run_id, "h1", "exited", rc=7, uptime_s=67.0, detail="exited",
                                generation=0),
                      *expected_states()[-2:]]


def test_an_answer_for_every_run_reads_as_the_answer_for_each() -> None:
    """parse_statuses on the agent's answer with no run id == parse_status on its answer for one run."""
    reports = [{"run_id": "a", "state": "exited", "rc": 0, "started": 1.0, "ended": 3.0},
               {"run_id": "b", "state": "bogus"}, "junk"]
    together = parse_statuses(("a", "b", "c"), "h1", json.dumps(reports))
    alone = {run_id: parse_status(run_id, "h1", json.dumps([r for r in reports if isinstance(r, dict)
                                                             and r["run_id"] == run_id]))
             for run_id in ("a", "b", "c")}
    assert together == alone
    assert together["c"] == HostState("c", "h1", "unknown", detail="the agent does not know this run")
    assert parse_statuses(("a",), "h1", "Welcome\n[]") == {"a": parse_status("a", "h1", "Welcome\n[]")}
    assert parse_statuses(("a", "b"), "h1", "{}") == {
        r: HostState(r, "h1", "unknown", detail="the agent's answer is not a list of reports") for r in "ab"}


def test_the_agents_status_of_all_runs_reads_proc_once_and_finds_the_running_one(tmp_path: Path) -> None:
    """`status` with no run id: the tagged processes of every run from one pass (tagged_runs), the
    same as a pass per run (tagged_pids)."""
    run_id = "20261201-000009-ffff"
    folder = tmp_path / host_dir(run_id, "h1")
    folder.mkdir(parents=True)
    (folder / AGENT_PIDFILE).write_text(json.dumps({"run_id": run_id, "host": "h1", "started": time.time()}))
    ended(tmp_path, RUNS[0], 0)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, ENV_RUN_ID: run_id, ENV_HOST: "h1"})
    try:
        deadline = time.monotonic() + 20
        while not tagged_pids(run_id, "h1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tagged_runs("h1").get(run_id) == tagged_pids(run_id, "h1") == [worker.pid]
        assert run_id not in tagged_runs("h2")
        answer = subprocess.run([sys.executable, "-m", "meshrun.deploy.host.agent", "status", "--host", "h1"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    finally:
        worker.kill()
        worker.wait()
    states = parse_statuses((RUNS[0], run_id), "h1", answer.stdout)
    assert states[RUNS[0]] == HostState(RUNS[0], "h1", "exited", rc=0, uptime_s=60.0, detail="exited",
                                         generation=0)
    assert states[run_id].state == "running"
    assert dataclasses.replace(states[run_id], uptime_s=None) == HostState(run_id, "h1", "running", generation=0)


def test_a_host_whose_command_does_not_finish_is_stuck_not_unreachable(tmp_path: Path) -> None:
    """SSH (here the local session) answered, the status command did not end in time: the host is
    overloaded or its disk hung, and `unreachable` would send the user to look at the network."""
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    session = transport.LocalSession(Host("h1", "local", None, None, 22, None, str(hang), str(tmp_path),
                                          Network.LAN, None, None, None, ()), tmp_path)
    with pytest.raises(NotFinished) as err:
        session.run([str(hang), "-m", "meshrun.deploy.host.agent", "status"], timeout=1)
    assert agents._unanswered(err.value) == "stuck"
    assert agents._unanswered(MeshrunError(DEAD)) == "unreachable"
    assert str(err.value) == ("host 'h1': `python -m meshrun.deploy.host.agent status` did not finish within 1 s: this "
                              "machine may be overloaded or its disk (NFS?) hung")
