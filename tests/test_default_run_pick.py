"""`fab logs` and `fab stop` with no `--run` (day-two review, finding 6). A detached run gets no
summary, so one that ended days ago still "may be running" and is taken when no other may: `fab
logs` printed its lines with no word of which run they were, and `fab stop` said `h1: clean` and
`run X stopped on 1 host(s)` although its agent had answered `was_running: false`. Now logs says
first which run it took and why, and stop says the run was not running there and claims no stop.

The pure parts by exact equality; the commands as a user runs them, in a git project: h1 is this
machine (`address: local`, the real agent's `stop` and the real `tail`), gpu1 a port where nothing
listens (a connect there is refused at once: no sshd, no test bed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands.logs import picked
from meshrun.deploy.commands.stop import stopped_line
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.answers import StopAnswer, remaining_pids
from meshrun.deploy.run.hoststate import HostState
from meshrun.layout import ENV_HOST, ENV_RUN_ID, SUMMARY, log_path
from tests.clirun import run_meshrun, trap_project

ENDED_DETACHED, NEWER_ATTACHED = "20261206-170000-c139", "20261206-180830-339c"
STARTED = 1_800_000_000.0
AT = time.strftime("%Y-%m-%d %H:%M", time.localtime(STARTED))


def detached(hosts: tuple[str, ...] = ("h1", "h2"), earlier: tuple[str, ...] = ()) -> RunRecord:
    return RunRecord(ENDED_DETACHED, "/inv.yaml", hosts, STARTED, True, "10.0.0.1:29400", earlier=earlier)


def test_logs_says_which_run_it_took_and_why() -> None:
    tail = "; another: fab logs --run ID"
    assert picked(detached(), []) == (f"run {ENDED_DETACHED} (detached, started {AT} on h1,h2: the one run that "
                                      f"may still be running){tail}")
    asked = [HostState(ENDED_DETACHED, "h1", "exited", 0), HostState(NEWER_ATTACHED, "h1", "running")]
    assert picked(detached(), asked) == (f"run {ENDED_DETACHED} (detached, started {AT} on h1,h2: the newest that "
                                         f"may still be running; no host says any run is){tail}")
    asked = [HostState(ENDED_DETACHED, "h1", "running"), HostState(ENDED_DETACHED, "h2", "unreachable")]
    attached = RunRecord(ENDED_DETACHED, "/inv.yaml", ("h1", "h3"), STARTED, False, "x", earlier=("h3",))
    assert picked(attached, asked) == (f"run {ENDED_DETACHED} (attached, started {AT} on h1: the one its hosts say "
                                       f"is running){tail}")


def test_the_agents_was_running_is_kept_with_its_pids() -> None:
    answer = {"host": "h1", "run_id": "r1", "was_running": False, "remaining": []}
    assert remaining_pids("h1", answer) == StopAnswer((), False)
    assert remaining_pids("h1", {**answer, "was_running": True, "remaining": [7]}) == StopAnswer((7,), True)
    assert remaining_pids("h1", {"remaining": []}) == StopAnswer((), None)  # an agent that does not say
    with pytest.raises(MeshrunError) as bad:
        remaining_pids("h1", {**answer, "was_running": "no"})
    assert str(bad.value) == ("host 'h1': the agent's stop gave an unexpected answer: was_running is 'no'; "
                              "expected true, false or null")


@pytest.mark.parametrize(("running", "expected"), [
    ({"h1": False}, "run r1 was not running on h1: nothing was stopped (it had already ended)"),
    ({"h1": False, "h2": False}, "run r1 was not running on h1, h2: nothing was stopped (it had already ended)"),
    ({"h1": True, "h2": False}, "run r1 stopped on 1 host(s); it was not running on h2"),
    ({"h1": True, "h2": None}, "run r1 stopped on 2 host(s)"),  # None: an older agent, which does not say
    ({}, "run r1: no host answered; nothing was stopped"),
])
def test_the_last_line_of_a_stop_claims_only_the_stops_that_happened(running: dict, expected: str) -> None:
    assert stopped_line("r1", running) == expected



@pytest.fixture
def project(tmp_path: Path, refused_port: int) -> Path:
    """The review's runs dir: a detached run on h1 that ended (its agent gone, its train.log kept), then
    a newer attached run on gpu1 (gone now) that ended with its summary."""
    root, _key, host = trap_project(tmp_path, refused_port)
    inventory = root / "inventory" / "hosts.yaml"
    inventory.write_text(f"hosts:\n  gpu1:\n{host}  h1:\n    address: local\n    workdir: hostdir\n"
                         "known_hosts: known_hosts\n")
    now = time.time()
    RunRecord(ENDED_DETACHED, str(inventory), ("h1",), now - 7200, True, "standalone").save(root / "runs")
    train_log = root / "hostdir" / log_path(ENDED_DETACHED, "h1")
    train_log.parent.mkdir(parents=True)
    train_log.write_text("[h1:0] epoch 3/3 acc 0.97\n")
    RunRecord(NEWER_ATTACHED, str(inventory), ("gpu1",), now - 600, False, "standalone").save(root / "runs")
    (root / "runs" / NEWER_ATTACHED / SUMMARY).write_text(json.dumps({"run_id": NEWER_ATTACHED,
                                                                      "status": "succeeded"}))
    return root


def started_at(root: Path, run_id: str) -> str:
    record = json.loads((root / "runs" / run_id / "launch.json").read_text())
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(record["started"]))


def test_logs_with_no_run_names_the_old_detached_run_it_shows(project: Path) -> None:
    done = run_meshrun(project, "logs")
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout == (f"run {ENDED_DETACHED} (detached, started {started_at(project, ENDED_DETACHED)} on h1: "
                           "the one run that may still be running); another: meshrun logs --run ID\n"
                           "[h1:0] epoch 3/3 acc 0.97\n"), done


def test_stop_with_no_run_says_the_run_had_ended_and_claims_no_stop(project: Path) -> None:
    done = run_meshrun(project, "stop")
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout == (f"run {ENDED_DETACHED} was not running on h1 (already ended)\n"
                           f"run {ENDED_DETACHED} was not running on h1: nothing was stopped (it had already ended)\n")


def test_stop_of_a_run_that_runs_still_says_stopped(project: Path) -> None:
    """A process of the run on h1, tagged as the agent tags torchrun's: its agent says it was running."""
    env = {**os.environ, ENV_RUN_ID: ENDED_DETACHED, ENV_HOST: "h1"}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    try:
        done = run_meshrun(project, "stop", "--run", ENDED_DETACHED)
        assert worker.wait(timeout=30) == -signal.SIGTERM, done
    finally:
        worker.kill()
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout == (f"h1: clean, no process of run {ENDED_DETACHED} left\n"
                           f"run {ENDED_DETACHED} stopped on 1 host(s)\n"), done
