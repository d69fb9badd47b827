"""`python: ~/…` in the inventory (as both examples and check-network's own hint write it) is the
host's interpreter for every command meshrun runs there, torchrun's included. The shell expands a
`~/` only in the first word SSH sends (deploy/run/shell.py); torchrun's program comes later, after
the agent's `--` or the check's `timeout … env`, where it reached exec as a literal `~/…` and no
launch could start (exit 127). Each test runs the command the plan builds, through a real shell,
with HOME a temporary home holding the interpreter."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from meshrun.deploy.edges.check_probes import bounded_argv
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.run.plan import HostLaunch, LaunchOptions, agent_argv, env_block
from meshrun.deploy.run.shell import remote_command

REPO = Path(__file__).resolve().parents[1]
AT_HOME = "~/venv/bin/python"


def home_with_python(tmp_path: Path) -> Path:
    """A home whose ~/venv/bin/python is this test's interpreter (a wrapper: a venv's python found
    through a symlink elsewhere may not find its venv)."""
    home = tmp_path / "home"
    python = home / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return home


def host_at_home(workdir: Path) -> Host:
    return Host("h1", "10.0.0.1", None, "root", 22, None, AT_HOME, str(workdir), Network.LAN, None, 1, None,
                (("SECRET", "s;$x"),))


def run_at_home(command: str, home: Path, stdin: bytes) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-c", command], input=stdin, env=env, capture_output=True, timeout=120)


WRITES = "import os, sys; open('ran', 'w').write(os.environ['SECRET'] + ' ' + os.environ['PLAIN'])"


def test_the_agent_starts_torchrun_with_a_python_under_home(tmp_path: Path) -> None:
    home, workdir = home_with_python(tmp_path), tmp_path / "work"
    workdir.mkdir()
    host = host_at_home(workdir)
    torchrun = (AT_HOME, "-c", WRITES)  # in torchrun's place: what matters is its first word
    argv = agent_argv(host, LaunchOptions("home-" + os.urandom(3).hex(), detach=True), (("PLAIN", "p"),), torchrun,
                      "/controller/python")
    done = run_at_home(remote_command(str(workdir), argv), home, env_block(host))
    assert done.returncode == 0, done.stdout + done.stderr
    deadline = time.monotonic() + 60
    while not (workdir / "ran").exists() and time.monotonic() < deadline:  # the detached copy runs it after answering
        time.sleep(0.1)
    assert (workdir / "ran").read_text() == "s;$x p"


def test_the_checks_allreduce_starts_torchrun_with_a_python_under_home(tmp_path: Path) -> None:
    home, workdir = home_with_python(tmp_path), tmp_path / "work"
    workdir.mkdir()
    host = host_at_home(workdir)
    launch = HostLaunch(host, True, (("PLAIN", "p"), ("SECRET", "s;$x")), (AT_HOME, "-c", WRITES))
    done = run_at_home(remote_command(str(workdir), bounded_argv(launch, 60, "/controller/python")), home,
                       env_block(host))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / "ran").read_text() == "s;$x p"
