"""One host that cannot be reached costs that host, never the others: `fab stop` stops every
host it reaches and exits 1 naming the one it could not (and what becomes of the run there);
`fab logs` and `fab logs -f` show the others. The run here is real processes: host h1 is this
machine (`address: local`, the real agent's stop and the real `tail`), host h2 a port where
nothing listens. And a host listed twice (the launcher's entries for a host that came back)
is one host to the fan-out: served once, never waited for until the timeout."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import pytest

from meshrun.deploy.commands.stop import not_stopped
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.edges.livehost import LiveHost
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.layout import ENV_HOST, ENV_RUN_ID, HEARTBEAT_TIMEOUT_S, log_path
from tests.clirun import MESHRUN, git_project, meshrun_env, run_meshrun
from tests.fakesession import FakeSession, host


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: a connect there is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, RunRecord]]:
    """A project whose detached run is on h1 (this machine, workdir `hostdir/`) and h2 (down)."""
    root = git_project(tmp_path)
    (root / "inventory").mkdir()
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inventory = root / "inventory" / "hosts.yaml"
    inventory.write_text(f"hosts:\n  h1:\n    address: local\n    workdir: hostdir\n"
                         f"  h2:\n    address: 127.0.0.1\n    port: {closed_port()}\n    user: nobody\n"
                         f"    identity: {key}\nknown_hosts: inventory/known_hosts\n")
    (root / "inventory" / "known_hosts").write_text("")
    (root / "hostdir").mkdir()
    record = RunRecord(f"20261201-000000-{uuid.uuid4().hex[:4]}", str(inventory), ("h1", "h2"), time.time(), True,
                       "127.0.0.1:29400")
    record.save(root / "runs")
    yield root, record


def meshrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, *args, ssh_config=None, stdin=None)


def run_process(record: RunRecord, name: str) -> subprocess.Popen[bytes]:
    """A process of the run on this machine, tagged as the agent tags torchrun and its workers."""
    env = {**os.environ, ENV_RUN_ID: record.run_id, ENV_HOST: name}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)


def host_log(root: Path, record: RunRecord) -> Path:
    path = root / "hostdir" / log_path(record.run_id, "h1")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def stop_beside_a_worker(root: Path, record: RunRecord) -> subprocess.CompletedProcess[str]:
    """`meshrun stop` while a process of the run runs on h1: that process must end by SIGTERM."""
    worker = run_process(record, "h1")
    try:
        done = meshrun("stop", "--run", record.run_id, cwd=root)
        assert worker.wait(timeout=30) == -signal.SIGTERM, done.stdout + done.stderr
    finally:
        worker.kill()
    return done


def test_stop_stops_the_hosts_it_reaches_and_names_the_one_it_cannot(run: tuple[Path, RunRecord]) -> None:
    root, record = run
    done = stop_beside_a_worker(root, record)
    assert done.returncode == 1
    assert done.stdout == f"h1: clean, no process of run {record.run_id} left\n"
    errors = done.stderr.splitlines()
    assert len(errors) == 2 and errors[0].startswith("error: h2: host 'h2'"), done.stderr
    assert errors[1] == "error: " + not_stopped(record, ("h2",)).replace("fab stop", "meshrun stop")


def test_stop_hosts_gives_the_unreachable_host_its_own_entry(run: tuple[Path, RunRecord]) -> None:
    root, record = run
    worker = run_process(record, "h1")
    try:
        results = agents.stop_hosts(record, root, ("h1", "h2"))
        assert worker.wait(timeout=30) == -signal.SIGTERM
    finally:
        worker.kill()
    assert list(results) == ["h1", "h2"] and results.ok == {"h1": ()}
    assert str(results.failed["h2"]).startswith("host 'h2': ")


def test_a_host_taken_out_of_the_inventory_costs_that_host_only(run: tuple[Path, RunRecord]) -> None:
    """The record lists every host that ever took part; one the inventory no longer names cannot
    be reached, and is named, but h1 is stopped and its log shown all the same."""
    root, record = run
    gone = dataclasses.replace(record, hosts=("h1", "h3", "h2"))
    gone.save(root / "runs")
    worker = run_process(record, "h1")
    try:
        results = agents.stop_hosts(gone, root, ("h1", "h3", "h2"))
        assert worker.wait(timeout=30) == -signal.SIGTERM
    finally:
        worker.kill()
    assert list(results) == ["h1", "h3", "h2"] and results.ok == {"h1": ()}
    assert str(results.failed["h3"]) == (f"host 'h3' of run {record.run_id} is no longer in {record.inventory}; "
                                         "put it back in that inventory to reach it")
    states = {s.host: (s.state, s.detail) for s in agents.host_states(gone, root)}
    assert states["h3"] == ("unreachable", str(results.failed["h3"])) and states["h1"][0] != "unreachable"
    host_log(root, record).write_text("[h1:0] step 1\n")
    logs = meshrun("logs", "--run", record.run_id, cwd=root)
    assert logs.returncode == 1 and "[h1:0] step 1" in logs.stdout
    assert f"warning: host 'h3' of run {record.run_id} is no longer in" in logs.stderr


def test_a_dead_host_of_an_earlier_attempt_is_a_warning_not_a_failure(run: tuple[Path, RunRecord]) -> None:
    """`fab train --resume --hosts h1` left h2 out (it died): stop and logs still try it, and say
    so, but exit 0 once the latest attempt's hosts are stopped and shown."""
    root, record = run
    dataclasses.replace(record, earlier=("h2",)).save(root / "runs")
    done = stop_beside_a_worker(root, record)
    assert done.returncode == 0, done.stderr
    warned = done.stderr.replace("\n", " ")
    assert warned.startswith("warning: h2: host 'h2'") and "not reached: h2, of an earlier attempt" in warned
    host_log(root, record).write_text("[h1:0] step 1\n")
    logs = meshrun("logs", "--run", record.run_id, cwd=root)
    assert logs.returncode == 0 and "[h1:0] step 1" in logs.stdout and "warning: host 'h2'" in logs.stderr


def test_what_a_failed_stop_leaves_running() -> None:
    detached = RunRecord("r1", "/inv.yaml", ("h1", "h2", "h3"), 0.0, True, "10.0.0.1:29400")
    assert not_stopped(detached, ("h2",)) == (
        "run r1 was not stopped on h2 and may still be running there: a detached run's agent goes on there "
        "until its training ends, or until the run's --idle-stop rule, if it was started with one, stops it; "
        "run fab stop --run r1 again once it answers")
    attached = RunRecord("r1", "/inv.yaml", ("h1", "h2", "h3"), 0.0, False, "10.0.0.1:29400")
    assert not_stopped(attached, ("h2", "h3")) == (
        "run r1 was not stopped on h2, h3 and may still be running there: its agent stops the run there by "
        f"itself once the run's controller has been silent for {HEARTBEAT_TIMEOUT_S} s, so ending the "
        "controller (Ctrl-C in its terminal) ends it too; run fab stop --run r1 again once they answer")


def test_logs_show_the_hosts_it_reaches(run: tuple[Path, RunRecord]) -> None:
    root, record = run
    host_log(root, record).write_text("[h1:0] epoch 1\nplain line\n")
    done = meshrun("logs", "--run", record.run_id, cwd=root)
    assert done.returncode == 1
    assert done.stdout == "[h1:0] epoch 1\n[h1] plain line\n"
    errors = done.stderr.splitlines()
    assert len(errors) == 2 and errors[0].startswith("warning: host 'h2': "), done.stderr
    assert errors[1] == "error: no log from h2; see the lines above"


def test_logs_follow_the_hosts_it_reaches(run: tuple[Path, RunRecord]) -> None:
    root, record = run
    log = host_log(root, record)
    log.write_text("[h1:0] epoch 1\n")
    env = meshrun_env({"PYTHONUNBUFFERED": "1"}, ssh_config=None)
    # SIGINT as a terminal's Ctrl-C finds it: a runner started in the background (CI's) ignores
    # SIGINT, and Python leaves an ignored SIGINT ignored, so the command would never see it.
    follow = subprocess.Popen([MESHRUN, "logs", "-f", "--run", record.run_id], cwd=root, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(follow.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: "[h1:0] epoch 1\n" in seen, follow)
        with log.open("a") as more:
            more.write("[h1:0] epoch 2\n")  # followed: it arrives while the command runs
        wait_for(lambda: "[h1:0] epoch 2\n" in seen, follow)
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            _, err = follow.communicate(timeout=30)
        finally:
            follow.kill()
    reader.join(5)
    assert follow.returncode == 0 and seen == ["[h1:0] epoch 1\n", "[h1:0] epoch 2\n"]
    warning = err.splitlines()[0]
    assert warning.startswith("warning: host 'h2': ") and warning.endswith("; following the other hosts without it")


def wait_for(condition: object, proc: subprocess.Popen[str], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, f"fab logs -f ended early: {proc.returncode}"
        assert time.monotonic() < deadline, "the followed line never came"
        time.sleep(0.1)


def test_a_name_given_twice_is_served_once_and_not_waited_for() -> None:
    calls: list[str] = []
    lock = threading.Lock()

    def fn(one: Host) -> str:
        with lock:
            calls.append(one.name)
        return one.name.upper()

    twice = [SimpleNamespace(name="a"), SimpleNamespace(name="b"), SimpleNamespace(name="a")]
    started = time.monotonic()
    results = on_each(twice, fn, timeout=30)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10  # a hang guard: it waited out the 30 s before
    assert sorted(calls) == ["a", "b"] and dict(results) == {"a": "A", "b": "B"}


class CountingSession(FakeSession):
    def __init__(self, stdout: str) -> None:
        super().__init__(stdout)
        self.ran: list[Sequence[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        self.ran.append(argv)
        return super().run(argv, timeout=timeout, create_workdir=create_workdir)


def test_the_launcher_stops_a_host_that_came_back_once_over_its_newest_session(tmp_path: Path) -> None:
    plan = plan_launch(Selection((host(),), Rendezvous("h1", 29400)), LaunchOptions("r1"), {}, "/p")
    lost, back = CountingSession('{"remaining": []}'), CountingSession('{"remaining": []}')
    runner = JobRunner(plan, {"h1": lost}, lambda _h, _l: None, tmp_path, "/p")
    old = runner.hosts[0]
    old.done.set()
    old.lost = old.replaced = True
    runner.hosts.append(LiveHost(old.launch, back, old.log))  # as _rejoin appends the host's new entry
    started = time.monotonic()
    assert runner.stop_all() == {"h1": ()}
    assert time.monotonic() - started < 10  # a hang guard: it waited its whole 35 s before
    assert lost.ran == [] and [argv[3] for argv in back.ran] == ["stop"]
