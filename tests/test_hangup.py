"""SIGTERM and SIGHUP are a Ctrl-C (deploy/cli.py): the cleanup a Ctrl-C gets still runs. Before,
their default action ended the controller where it stood: no `finally` ran, so a `--firewall`
run's chain stayed up on every host, and an attached run got no graceful stop and no summary.

Real processes and real signals: `meshrun logs -f` (the real command, following a real `tail` on a
local host) ended by SIGTERM, and by the hangup of a real pseudo-terminal it runs in (the kernel
sends the SIGHUP, and the terminal then refuses every write); and a controller process that runs
the real `guarded` boundary and the real JobRunner over a fake host (what is under test is the
controller's signal handling, not SSH): its run is stopped gracefully, the `finally` around it
runs, a second signal during the stop does not cut the stop short, and the exit status is the
first signal's. One attached `fab train --script` on this machine (torchrun starts, no training)
proves the same end to end with summary.json."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import interrupted_by, interrupted_status
from meshrun.layout import log_path
from tests.clirun import MESHRUN, git_project, meshrun_env

TERM, HUP, INT = signal.SIGTERM, signal.SIGHUP, signal.SIGINT


def test_a_signal_that_ends_a_command_gives_128_plus_its_number_and_its_name() -> None:
    assert [interrupted_status(s) for s in (INT, HUP, TERM)] == [130, 129, 143]
    assert [interrupted_by(s) for s in (INT, HUP, TERM)] == ["Ctrl-C", "SIGHUP", "SIGTERM"]


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert proc.poll() is None, f"ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {within} s"
        time.sleep(0.05)


@pytest.fixture
def followed(tmp_path: Path) -> tuple[Path, RunRecord, dict[str, str]]:
    """A project whose run is on h1 (this machine, workdir `hostdir/`), with a line in its log."""
    root = git_project(tmp_path)
    (root / "inventory").mkdir()
    inventory = root / "inventory" / "hosts.yaml"
    inventory.write_text("hosts:\n  h1:\n    address: local\n    workdir: hostdir\n")
    record = RunRecord(f"20261201-000000-{uuid.uuid4().hex[:4]}", str(inventory), ("h1",), time.time(), True,
                       "127.0.0.1:29400")
    record.save(root / "runs")
    log = root / "hostdir" / log_path(record.run_id, "h1")
    log.parent.mkdir(parents=True)
    log.write_text("[h1:0] epoch 1\n")
    env = meshrun_env({"PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}, ssh_config=None)
    return root, record, env


def test_logs_follow_ended_by_sigterm_exits_143_with_one_line(followed: tuple[Path, RunRecord, dict[str, str]],
                                                               tmp_path: Path) -> None:
    root, record, env = followed
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        follow = subprocess.Popen([MESHRUN, "logs", "-f", "--run", record.run_id], cwd=root, env=env,
                                  stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        wait_until(lambda: "[h1:0] epoch 1" in out.read_text(), follow, "the followed line")
        follow.send_signal(TERM)
        assert follow.wait(30) == 143, err.read_text()
    finally:
        follow.kill()
        follow.wait()
    assert err.read_text() == "error: interrupted by SIGTERM\n"
    assert not (tmp_path / "cache" / "meshrun" / "debug.log").exists()


def test_logs_follow_in_a_terminal_that_closes_exits_129(followed: tuple[Path, RunRecord, dict[str, str]],
                                                         tmp_path: Path) -> None:
    """The terminal itself goes (its master side closed, as when a terminal window or an SSH session
    closes): the kernel sends SIGHUP, and every later write to the terminal fails with EIO. The
    command's last line would have been such a write: it goes to /dev/null, and the exit status is
    SIGHUP's, not 1 for an OSError on the way out."""
    root, record, env = followed
    master, slave = os.openpty()

    def own_terminal() -> None:  # after setsid (start_new_session): the pty becomes its controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    follow = subprocess.Popen([MESHRUN, "logs", "-f", "--run", record.run_id], cwd=root, env=env, stdin=slave,
                              stdout=slave, stderr=slave, start_new_session=True, preexec_fn=own_terminal)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 60
    try:
        while b"epoch 1" not in seen:  # in colour: a terminal
            assert follow.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 4096)
        os.close(master)  # the hangup
        master = -1
        assert follow.wait(30) == 129
    finally:
        if master >= 0:
            os.close(master)
        follow.kill()
        follow.wait()
    debug_log = tmp_path / "cache" / "meshrun" / "debug.log"
    assert not debug_log.exists(), debug_log.read_text(errors="replace")


CONTROLLER = r'''
import json, sys, threading, time
from pathlib import Path
from invoke.exceptions import Exit
from meshrun.deploy.cli import guarded
from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch

out = Path(sys.argv[1])
host = Host("h1", "10.0.0.1", ssh_address=None, user="root", port=22, identity=None, python="/venv/bin/python",
            workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


class Agent:
    """Says it started, then nothing until its stdin closes (the controller's stop)."""
    def __init__(self):
        self.closed, self.said = threading.Event(), False
    def readline(self):
        if not self.said:
            self.said = True
            return b"agent started\n"
        self.closed.wait(120)
        return b""
    def send(self, data, timeout=0.0):
        return True
    def close_stdin(self):
        self.closed.set()
    abandon = close_stdin
    def poll(self):
        return 0 if self.closed.is_set() else None
    def wait(self, timeout=None):
        return 0 if self.closed.wait(timeout) else None


class Session:
    def run(self, argv, *, timeout=60, create_workdir=False):  # the agent's stop: TERM, grace, KILL
        (out / "stop-began").write_text("")
        deadline = time.monotonic() + 30  # the stop lasts until the test has sent its second signal
        while not (out / "second-sent").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # and for its handler to have run
        (out / "stopped").write_text(" ".join(argv))
        return CommandResult(0, '{"remaining": []}', "")
    def start(self, argv):
        return Agent()
    def ping(self, timeout):
        return True
    def close(self):
        pass


@guarded
def train():
    plan = plan_launch(Selection((host,), Rendezvous("h1", 29400)), LaunchOptions("r1"), {}, "/p")
    try:
        outcome = JobRunner(plan, {"h1": Session()}, lambda _h, line: print(line, flush=True), out, "/p").run()
        (out / "outcome.json").write_text(json.dumps([outcome.status.value, outcome.reason, outcome.interrupted]))
        return 1  # `fab train`'s status for a stopped run
    finally:
        (out / "finally").write_text("")  # where `--firewall` takes its chain down


try:
    sys.exit(train())
except Exit as done:
    sys.exit(done.code)
'''


@pytest.mark.parametrize("first,second,status", [(TERM, HUP, 143), (HUP, TERM, 129), (INT, INT, 1)])
def test_a_signalled_controller_stops_its_run_gracefully_and_runs_its_finally(
        first: int, second: int, status: int, tmp_path: Path) -> None:
    """The first signal stops the run on every host; the second comes during that stop and must not cut
    it short. Output goes to files, which a SIGHUP leaves alone, so the lines are seen. A Ctrl-C keeps
    the exit status of the command (this stand-in returns 1; `fab train` returns 128 + the outcome's
    `interrupted`, tests/test_fab_local.py); a TERM or HUP gives its own whatever the command returns."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        # SIGINT as a terminal's Ctrl-C finds it: a process started in the background ignores it.
        controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], stdout=stdout, stderr=stderr,
                                      start_new_session=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
                                      preexec_fn=lambda: signal.signal(INT, signal.SIG_DFL))
    try:
        wait_until(lambda: "[h1] agent started" in out.read_text(), controller, "the agent's first line")
        controller.send_signal(first)
        wait_until(lambda: (tmp_path / "stop-began").exists(), controller, "the stop")
        controller.send_signal(second)
        (tmp_path / "second-sent").touch()
        assert controller.wait(60) == status, err.read_text()
    finally:
        controller.kill()
        controller.wait()
    assert "agent stop" in (tmp_path / "stopped").read_text() and (tmp_path / "finally").exists()
    assert json.loads((tmp_path / "outcome.json").read_text()) == [
        "stopped", f"interrupted ({interrupted_by(first)})", first]  # deploy/commands/train.py: its exit status
    assert out.read_text().splitlines()[1:] == [
        "meshrun: stopping every host (TERM, 5 s grace, KILL) and checking that each is clean; Ctrl-C again does "
        "not cut this short",
        "meshrun: still stopping every host; Ctrl-C again does not cut this short"]
    assert err.read_text() == ("" if first == INT else f"error: interrupted by {interrupted_by(first)}\n")


SLEEPER = '''import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop then lasts its grace: room for a second signal
print("sleeping", flush=True)
time.sleep(600)
'''


@pytest.mark.slow
def test_an_attached_run_ended_by_sigterm_is_stopped_and_summarised_and_exits_143(tmp_path: Path) -> None:
    """`fab train` on this machine, a script that sleeps (torchrun starts; nothing trains). SIGTERM to
    the controller alone: every host is stopped, summary.json says so, and a SIGHUP during the stop
    (the terminal closing as well) neither cuts it short nor turns writing into an error."""
    from tests.fabrun import run_id_of, run_processes, wait_no_run_processes

    root = git_project(tmp_path)
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yaml").write_text("hosts:\n  local:\n    address: local\n    nproc: 1\n    workdir: .\n")
    (root / "sleeper.py").write_text(SLEEPER)
    env = meshrun_env({"XDG_CACHE_HOME": str(tmp_path)}, ssh_config=None)
    out = tmp_path / "out"
    with out.open("w") as stdout:  # a pipe's reader could go with the terminal; a file keeps what came before
        train = subprocess.Popen([MESHRUN, "train", "--inventory", "inventory/hosts.yaml", "--skip-checks", "--no-sync",
                                  "--script", "sleeper.py"], cwd=root, env=env, stdout=stdout, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    run_id = ""
    try:
        wait_until(lambda: "[local:0] sleeping" in out.read_text(), train, "the script's line", within=180)
        run_id = run_id_of(out.read_text())
        train.send_signal(TERM)
        wait_until(lambda: "meshrun: stopping every host" in out.read_text(), train, "the stop")
        train.send_signal(HUP)
        assert train.wait(90) == 143, out.read_text()[-3000:]
    finally:
        train.kill()
        train.wait()
        if run_id:
            wait_no_run_processes(run_id, timeout=30)
    summary = json.loads((root / "runs" / run_id / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("stopped", "interrupted (SIGTERM)")
    assert not run_processes(run_id) and not (tmp_path / "meshrun" / "debug.log").exists()
