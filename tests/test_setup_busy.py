"""No `fab setup` under a running run (the shared-hosts review, finding 6).

pip replaced meshrun and the project's packages in the venv a run executes from: its next worker
restart imported another build than its peers. Now the host side answers busy, naming the run,
while any run's agent holds its `agent.lock` in the workdir. The host script runs as a real
process, shipped as the controller ships it; the agent's lock is held by a real child process
(as procs.hold_lock holds it); the venv is a stand-in whose `python` records each pip call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from meshrun.layout import AGENT_LOCK, AGENT_LOCKS, host_dir
from meshrun.deploy.commands import setup
from meshrun.deploy.host import setup as host_setup
from tests.fakesession import failure, host
from tests.test_setup_lock import REQUEST, LocalSession, answer, host_script, pip_calls, workdir_with_venv

RUN = "20261201-100000-aaaa"
# Holds the lock as the agent does (flock LOCK_EX, its pid written), says so, and waits for stdin to close.
HOLDER = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
sys.stdin.read()
"""


def agent_lock(workdir: Path, run: str = RUN, name: str = "gpu2") -> Path:
    path = workdir / host_dir(run, name) / AGENT_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def hold(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    holder.communicate(timeout=30)


def busy(pid: int) -> str:
    return (f"run {RUN} is running from this workdir (agent pid {pid} on gpu2): setup would reinstall meshrun and "
            f"the project's requirements under it; stop it first (fab stop --run {RUN}) or wait for it to end")


def test_a_run_s_held_agent_lock_is_that_host_s_one_line_and_no_pip_runs(tmp_path: Path) -> None:
    workdir = workdir_with_venv(tmp_path)
    lock = agent_lock(workdir)
    holder = hold(lock)
    try:
        assert answer(host_script(workdir)) == (1, {"error": busy(holder.pid), "busy": True})
        assert failure(lambda: setup._run_setup(host(), LocalSession(workdir), REQUEST, False)) == (
            f"host 'h1': setup failed: {busy(holder.pid)}")
        assert pip_calls(workdir) == [] and not (workdir / ".venv" / "meshrun-installed").exists()
        assert lock.read_text() == f"{holder.pid}\n"  # the agent's lock, untouched
    finally:
        release(holder)
    rc, done = answer(host_script(workdir))  # the run ended: setup runs
    assert rc == 0 and done["actions"][0].startswith("installed meshrun (build 0123456789ab)"), done
    assert sum(" -m pip install " in call for call in pip_calls(workdir)) == 2


def test_locks_of_ended_runs_and_things_that_are_no_lock_do_not_count(tmp_path: Path) -> None:
    workdir = workdir_with_venv(tmp_path)
    agent_lock(workdir, "20261130-000000-bbbb").write_text("123\n")  # an ended run's: nobody holds it
    os.mkfifo(agent_lock(workdir, "20261130-000000-cccc"))  # not a file: opened without blocking, skipped
    agent_lock(workdir, "20261130-000000-dddd", "h3").symlink_to("/dev/null")  # a link: not followed
    rc, done = answer(host_script(workdir))
    assert rc == 0 and done["actions"], done


def test_several_running_runs_are_each_named(tmp_path: Path) -> None:
    workdir = workdir_with_venv(tmp_path)
    holders = [hold(agent_lock(workdir, run, name)) for run, name in
               ((RUN, "gpu1"), (RUN, "gpu2"), ("20261201-110000-bbbb", "gpu2"))]
    try:
        held = host_setup.running_agents(str(workdir / AGENT_LOCKS))
        assert [(run, name) for run, name, _ in held] == [(RUN, "gpu1"), (RUN, "gpu2"),
                                                          ("20261201-110000-bbbb", "gpu2")]
        rc, done = answer(host_script(workdir))
        pids = [h.pid for h in holders]
        assert (rc, done["error"]) == (1, (
            f"runs {RUN}, 20261201-110000-bbbb are running from this workdir (agents pid {pids[0]} on gpu1, pid "
            f"{pids[1]} on gpu2, pid {pids[2]} on gpu2): setup would reinstall meshrun and the project's requirements "
            "under them; stop them first (fab stop --run ID, for each) or wait for them to end"))
    finally:
        for holder in holders:
            release(holder)
    assert pip_calls(workdir) == []
