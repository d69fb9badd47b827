"""A detached start whose copy writes no pidfile within its window (an orphans review, finding 1).

The copy runs in a session of its own. When it was slower than START_WINDOW_S (a loaded host, a
cold NFS home), the start answered "agent did not start" and returned, and the copy went on to
start torchrun: detached, on the host's GPUs, with nothing said; neither a Ctrl-C's stop nor the
hinted `fab stop` (which found no pidfile yet) reached it. Now the copy is stopped before the
answer, which says so. Real agents and real processes on this machine, as the review's demo."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable

import pytest

from meshrun.deploy.host import agent, agentstart
from meshrun.deploy.host.procs import alive, tagged_pids
from meshrun.layout import AGENT_PIDFILE, EXIT_RECORD, host_dir

HOST = "h1"


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    """Poll until check() is truthy: generous, never a fixed sleep (a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


@pytest.fixture
def copies(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """Every copy start_detached makes, recorded; in the run's own dir (the agent's paths are
    relative). Whatever a failing test left running is ended afterwards."""
    monkeypatch.chdir(tmp_path)
    made: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    runs: list[str] = []
    yield made, runs
    monkeypatch.undo()
    for copy in made:
        if copy.poll() is None:
            copy.terminate()  # its handler stops its run; one before the handler ends it bare
            try:
                copy.wait(30)
            except subprocess.TimeoutExpired:
                copy.kill()
    for pid in (pid for run_id in runs for pid in tagged_pids(run_id, HOST)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def detached_args(run_id: str, *command: str):  # type: ignore[no-untyped-def]
    args = agent.parse(["run", "--run-id", run_id, "--host", HOST, "--heartbeat-timeout", "0", "--grace", "1",
                        "--detach", "--env-stdin", "--", *command])
    args.secret_env = {}
    return args


def answered(capsys) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_nothing_left(run_id: str, copy: subprocess.Popen) -> None:  # type: ignore[type-arg]
    assert copy.poll() is not None  # the copy is gone when the answer comes: nothing of it can start later
    wait_for(lambda: not tagged_pids(run_id, HOST), 30, "the run's tagged processes to end")
    record = agentstart.read_json(Path(host_dir(run_id, HOST)) / AGENT_PIDFILE)
    assert record is None or not alive(record["agent_pid"])


def test_a_copy_slower_than_its_window_is_stopped_and_the_answer_says_so(
        copies, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The review's demo: a 0.05 s window stands in for a copy slower than 10 s."""
    made, runs = copies
    run_id = f"window-{secrets.token_hex(3)}"
    runs.append(run_id)
    monkeypatch.setattr(agentstart, "START_WINDOW_S", 0.05)
    assert agentstart.start_detached(detached_args(run_id, "sleep", "60")) == 1
    assert answered(capsys) == {"error": f"agent did not start within 0.05 s, so its copy was stopped; see "
                                         f"runs/{run_id}/hosts/{HOST}/train.log"}
    assert len(made) == 1
    assert_nothing_left(run_id, made[0])


def test_a_copy_whose_window_ends_once_its_command_runs_stops_that_command(
        copies, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The worst case: the window ends just as the copy has started torchrun (its pidfile is there,
    unread). The copy's own TERM handler stops its run; it is not merely killed (exit 143, its exit
    record's reason the signal). The window's end is a clock moved on, not a race."""
    made, runs = copies
    run_id = f"window-{secrets.token_hex(3)}"
    runs.append(run_id)
    clock = types.SimpleNamespace(offset=0.0)
    read = agentstart.read_json

    def unread(path: Path) -> dict | None:
        record = read(path)
        if path.name == AGENT_PIDFILE and record is not None:
            clock.offset = 1e6  # the copy's command runs: its window ends now, the pidfile unseen
            return None
        return record

    monkeypatch.setattr(agentstart, "read_json", unread)
    monkeypatch.setattr(agentstart, "time", types.SimpleNamespace(
        monotonic=lambda: time.monotonic() + clock.offset, sleep=time.sleep))
    monkeypatch.setattr(agentstart, "START_WINDOW_S", 600.0)  # a loaded machine's copy takes what it needs
    monkeypatch.setattr(agentstart, "COPY_STOP_MARGIN_S", 600.0)  # and so does its stop: no KILL here
    assert agentstart.start_detached(detached_args(run_id, "sleep", "60")) == 1
    assert answered(capsys)["error"].startswith("agent did not start within 600 s, so its copy was stopped")
    pidfile = read(Path(host_dir(run_id, HOST)) / AGENT_PIDFILE)
    assert pidfile is not None and pidfile["agent_pid"] == made[0].pid  # its command had started
    assert made[0].returncode == 128 + signal.SIGTERM
    assert read(Path(host_dir(run_id, HOST)) / EXIT_RECORD)["reason"] == "signal SIGTERM"
    assert_nothing_left(run_id, made[0])
    assert not alive(pidfile["pgid"])


def test_a_copy_that_outlives_its_term_and_grace_is_killed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A copy stuck past its TERM and grace (its handler never runs its stop) is KILLed, not left."""
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(120)\n"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert stuck.stdout is not None and stuck.stdout.readline() == b"ready\n"  # TERM is ignored from here
        assert stuck.stderr is not None
        os.set_blocking(stuck.stderr.fileno(), False)  # as start_detached has it
        monkeypatch.setattr(agentstart, "COPY_STOP_MARGIN_S", 0.2)
        args = types.SimpleNamespace(grace=0.0)
        said = agentstart._stopped_late(args, stuck, Path("runs/r1/hosts/h1") / AGENT_PIDFILE)  # type: ignore[arg-type]
        assert said == "agent did not start within 10 s, so its copy was stopped; see runs/r1/hosts/h1/train.log"
        assert stuck.returncode == -signal.SIGKILL
    finally:
        if stuck.poll() is None:
            stuck.kill()
            stuck.wait()
