"""One `fab setup` at a time on a host (deploy/host/setup.py): a Ctrl-C or a dropped SSH connection
sends the host script no signal, so its pip ran on, and a rerun's pip installed into the same venv
beside it. Now the rerun answers that another setup runs there (its pid), and ending that pid ends
its pip too. The host script runs as a real process, shipped as the controller ships it (`python -c`);
its venv is a stand-in whose `python` records each call, so the tests see whether pip ran."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from meshrun.deploy.commands import setup
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.host import setup as host_setup
from meshrun.deploy.run.requirements import Requirements
from tests.fakesession import failure, host

# `python -m pip ...` logs its pid and arguments, then sleeps $PIP_SLEEP s (exec: the sleep is pip's pid).
FAKE_PYTHON = """#!/bin/sh
echo "$$ $*" >> "$(dirname "$0")/../../pip-calls"
case "$1" in -m) exec sleep "${PIP_SLEEP:-0}";; esac
echo 2.4.1
"""
REQUEST = setup.SetupRequest(sys.executable, None, Path("meshrun-0.1.0-py3-none-any.whl"),
                             Identity("0.1.0", "0123456789ab"), Requirements())


def workdir_with_venv(tmp_path: Path) -> Path:
    """A workdir whose .venv is whole (python and pip there), so setup goes straight to pip."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "pip").write_text("")
    return tmp_path


def host_script(workdir: Path, pip_sleep: float = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(setup.setup_argv(REQUEST), cwd=workdir, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PIP_SLEEP": str(pip_sleep)})


def answer(process: subprocess.Popen[str]) -> tuple[int, dict]:
    out, _ = process.communicate(timeout=60)
    return process.returncode, json.loads(out)


def pip_calls(workdir: Path) -> list[str]:
    calls = workdir / "pip-calls"
    return calls.read_text().splitlines() if calls.exists() else []


class LocalSession:
    """Runs the argv here, in the workdir, as SSH would run it on the host."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        done = subprocess.run(list(argv), cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr)


def held_lock(workdir: Path):  # type: ignore[no-untyped-def]
    """The workdir's setup lock file, opened for writing (its folder in the user's cache made first)."""
    path = host_setup.lock_file(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w")


def busy(pid: int) -> str:
    return f"another fab setup is still running on this host (pid {pid}); wait for it, or end it (kill {pid})"


def test_a_held_lock_is_that_hosts_one_line_and_no_pip_runs(tmp_path: Path) -> None:
    workdir = workdir_with_venv(tmp_path)
    with held_lock(workdir) as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"{os.getpid()}\n")
        held.flush()
        assert answer(host_script(workdir)) == (1, {"error": busy(os.getpid()), "busy": True})
        # As the controller shows it: that host's failure, without the `--base` question.
        assert failure(lambda: setup._run_setup(host(), LocalSession(workdir), REQUEST, False)) == (
            f"host 'h1': setup failed: {busy(os.getpid())}")
    assert pip_calls(workdir) == []


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A setup whose pip is running (for 120 s), in its workdir; ended and reaped after the test whatever happened."""
    workdir = workdir_with_venv(tmp_path)
    first = host_script(workdir, pip_sleep=120)
    deadline = time.monotonic() + 30
    while not pip_calls(workdir) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield workdir, first
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
        for line in pip_calls(workdir):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_workdir_shared_with_another_host_names_that_host(tmp_path: Path) -> None:
    """A home on NFS is every host's: the setup of another host into the same .venv holds the lock."""
    workdir = workdir_with_venv(tmp_path)
    with held_lock(workdir) as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242 gpu2.lab\n")
        held.flush()
        assert answer(host_script(workdir)) == (1, {"busy": True, "error": (
            "another fab setup is still running in this workdir, from gpu2.lab, which shares it (pid 4242 there); "
            "wait for it, or end it there")})
    assert pip_calls(workdir) == []


def test_a_rerun_meets_the_running_setup_and_ending_it_ends_its_pip(
        running: tuple[Path, subprocess.Popen[str]]) -> None:
    workdir, first = running
    pip_pid = int(pip_calls(workdir)[0].split()[0])
    assert answer(host_script(workdir)) == (1, {"error": busy(first.pid), "busy": True})
    assert len(pip_calls(workdir)) == 1  # the rerun started no pip of its own

    first.send_signal(signal.SIGTERM)  # `kill PID`, as the answer says
    assert first.wait(timeout=30) == 128 + signal.SIGTERM
    assert not Path(f"/proc/{pip_pid}").exists()  # its pip was ended and reaped with it

    rc, done = answer(host_script(workdir))  # the lock went with it: the next setup runs
    assert rc == 0 and done["actions"][0].startswith("installed meshrun (build 0123456789ab)"), done


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_the_lock_is_held_by_the_running_script_alone(running: tuple[Path, subprocess.Popen[str]],
                                                      signum: int) -> None:
    """The lock file outlives the script, the lock does not: a setup that ended leaves no stale lock."""
    workdir, first = running
    with open(host_setup.lock_file(workdir)) as lock:
        with pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock.read() == f"{first.pid} {socket.gethostname()}\n"
        first.send_signal(signum)
        assert first.wait(timeout=30) == 128 + signum
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
