"""An agent that cannot write its run's files (a full disk) says so in one line, never a traceback
(findings "stalls", 6): the attached agent died in hold_lock's os.write with a traceback, and a
detached start answered "agent did not start; see …/train.log", a log that was never written, its
copy's ENOSPC gone to /dev/null. A copy that wrote no pidfile stops what it started.

The real agent, in processes of its own. The full disk is the one stand-in: a sitecustomize (on
PYTHONPATH, so the detached copy has it too) makes the lock's os.write, or the pidfile's write,
fail with ENOSPC, as a full disk does; every other write is real."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.host.agentstart import CANNOT_WRITE_EXIT, cannot_write_line, failed_start
from meshrun.deploy.host.agentargs import parse
from meshrun.deploy.host.procs import tagged_pids
from meshrun.layout import AGENT_PIDFILE, host_dir

FULL = '''import errno, os
_how = os.environ.get("MESHRUN_TEST_FULL")
if _how == "lock":  # every write to a file fails: hold_lock's os.write is the first
    _write = os.write
    def _full(fd, data):
        if fd > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write(fd, data)
    os.write = _full
elif _how == "pidfile":  # the lock is written; the pidfile, after torchrun started, is not
    from meshrun import fsutil
    _real = fsutil.atomic_write_json
    def _json(path, obj):
        if path.name == "agent.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _real(path, obj)
    fsutil.atomic_write_json = _json
'''
NO_SPACE = "No space left on device"


def agent(tmp_path: Path, how: str, run_id: str, *flags: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(FULL)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    return subprocess.run([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host",
                           "local", "--heartbeat-timeout", "0", "--grace", "2", *flags, "--", *command],
                          cwd=work, env={**os.environ, "PYTHONPATH": path, "MESHRUN_TEST_FULL": how}, input="{}\n",
                          capture_output=True, text=True, timeout=60)


def line(tmp_path: Path, path: str) -> str:
    return f"cannot write {path} on local: {NO_SPACE}; free space in {os.path.realpath(tmp_path / 'work')}"


@pytest.mark.parametrize("how,what", [("lock", ""), ("pidfile", f"/{AGENT_PIDFILE}")])
def test_an_attached_agent_says_it_cannot_write_in_one_line(tmp_path: Path, how: str, what: str) -> None:
    run_id = f"full-{how}"
    done = agent(tmp_path, how, run_id)
    assert (done.returncode, done.stdout) == (CANNOT_WRITE_EXIT,
                                              f"meshrun-agent: {line(tmp_path, host_dir(run_id, 'local') + what)}\n")
    assert "Traceback" not in done.stderr, done.stderr
    assert tagged_pids(run_id, "local") == []  # what it started, it stopped


@pytest.mark.parametrize("how,what", [("lock", ""), ("pidfile", f"/{AGENT_PIDFILE}")])
def test_a_detached_start_answers_the_copys_own_reason(tmp_path: Path, how: str, what: str) -> None:
    run_id = f"full-detached-{how}"
    done = agent(tmp_path, how, run_id, "--detach", "--env-stdin")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"error": line(tmp_path, host_dir(run_id, "local") + what)}
    assert tagged_pids(run_id, "local") == []


def test_a_copy_that_ended_with_a_traceback_is_answered_with_its_last_line() -> None:
    args = parse(["run", "--run-id", "r1", "--host", "h1", "--", "true"])
    pidfile = Path(host_dir("r1", "h1")) / AGENT_PIDFILE
    crash = b"Traceback (most recent call last):\n  File \"x\", line 1\nOSError: [Errno 5] Input/output error\n"
    assert failed_start(args, 1, crash, pidfile) == {
        "error": "agent did not start: OSError: [Errno 5] Input/output error"}
    assert failed_start(args, 1, b"", pidfile) == {"error": "agent did not start; see runs/r1/hosts/h1/train.log"}


def test_the_line_says_what_to_do_for_each_cause() -> None:
    def said(code: int) -> str:
        return cannot_write_line("runs/r1/hosts/h1", "h1", OSError(code, os.strerror(code)), "/w")

    assert said(errno.ENOSPC) == "meshrun-agent: cannot write runs/r1/hosts/h1 on h1: No space left on device; free space in /w"
    assert said(errno.EROFS).endswith(": Read-only file system; make /w writable by this user")
    assert said(errno.EIO).endswith(": Input/output error; check the disk of /w")
