"""One agent per run and host (a scale/concurrency review, defect 4).

A second agent of a run on a host (a detached `fab join` of a host still in the run, `fab train
--resume` of a run still running) used to run its own torchrun beside the first, and when that
ended its sweep of the run's tagged processes killed the first one's torchrun and workers. A
detached start took any pidfile of the run, a stale one too, for its own. Now the agent holds
`agent.lock` in its host dir for its life and a second one refuses, naming the holder's pid, and
`fab train --resume` refuses a run that still runs. Real agents, real processes, a real local host.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.records import RunRecord, refuse_running
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.host.agent import busy_line
from meshrun.deploy.run.answers import AgentBusy, detached_failure, detached_record
from meshrun.deploy.host.procs import alive
from meshrun.layout import AGENT_BUSY_EXIT
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.hoststate import HostState
from meshrun.deploy.run.plan import Workload
from meshrun.layout import AGENT_LOCK, AGENT_MODULE, AGENT_PIDFILE, SUMMARY, host_dir

RUN = f"20260101-000000-{secrets.token_hex(2)}"  # per test process: agents sweep processes by run id and host, machine-wide
SLEEPER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n"


def agent_argv(*extra: str, command: list[str]) -> list[str]:
    return [sys.executable, "-m", AGENT_MODULE, "run", "--run-id", RUN, "--host", "local", "--heartbeat-timeout", "0",
            "--grace", "2", *extra, "--", *command]


def wait_for(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def read_pid(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text.isdigit() else None


@pytest.fixture
def first(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A running agent of RUN on host `local` in tmp_path (its workdir), and the pid of its command."""
    marker = tmp_path / "first.pid"
    agent = subprocess.Popen(agent_argv("--quiet", command=[sys.executable, "-c", SLEEPER, str(marker)]), cwd=tmp_path,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        worker = wait_for(lambda: read_pid(marker), 20, "the first agent's command")
        # Its pidfile comes once the command has started (it names the command's pid): after the marker.
        wait_for((tmp_path / host_dir(RUN, "local") / AGENT_PIDFILE).exists, 20, "the first agent's pidfile")
        yield agent, worker
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)


def test_a_second_agent_of_the_run_refuses_and_leaves_the_first_running(tmp_path: Path, first) -> None:  # type: ignore[no-untyped-def]
    """The old second agent ran `true`, and its end swept the run's tagged processes: the first's command too."""
    agent, worker = first
    second = subprocess.run(agent_argv(command=["true"]), cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=30)
    assert second.returncode == AGENT_BUSY_EXIT == 75
    assert second.stdout.decode() == (
        f"meshrun-agent: run {RUN} already has an agent on host 'local' (pid {agent.pid}, holding "
        f"runs/{RUN}/hosts/local/{AGENT_LOCK}); this one started nothing: see it with fab status --run {RUN}\n")
    time.sleep(0.5)
    assert alive(worker) and agent.poll() is None
    pidfile = json.loads((tmp_path / host_dir(RUN, "local") / AGENT_PIDFILE).read_text())
    assert pidfile["agent_pid"] == agent.pid  # the first's pidfile, untouched
    lock = tmp_path / host_dir(RUN, "local") / AGENT_LOCK
    assert lock.read_text() == f"{agent.pid}\n"
    # Not inherited: the first agent's command holds no descriptor of the lock (O_CLOEXEC).
    held = {os.readlink(f"/proc/{worker}/fd/{fd}") for fd in os.listdir(f"/proc/{worker}/fd")}
    assert str(lock) not in held


def test_a_detached_start_beside_a_running_agent_reports_the_refusal_not_the_running_pidfile(
        tmp_path: Path, first) -> None:  # type: ignore[no-untyped-def]
    """The old detached start printed the first agent's pidfile (its run id matched) and exited 0."""
    agent, worker = first
    started = subprocess.run(agent_argv("--detach", "--env-stdin", command=["true"]), cwd=tmp_path, input=b"{}\n",
                             capture_output=True, timeout=30)
    assert started.returncode == 1
    assert json.loads(started.stdout) == {"error": busy_line(RUN, "local", agent.pid), "busy": True}
    assert alive(worker) and agent.poll() is None


def test_a_busy_hosts_failed_detached_start_hints_status_not_a_stop_of_the_run_running_there() -> None:
    """The hint after a failed detached start was always `fab stop --run`; where a host refused
    because the run already had an agent there (another controller's start of it), that stop would end
    the run that controller started. A host answering `busy` is only believed for the hint's wording."""
    busy = pytest.raises(AgentBusy, detached_record, "h2", {"error": "already has an agent", "busy": True}).value
    lost = pytest.raises(MeshrunError, detached_record, "h3", {"error": "agent did not start", "busy": "yes"}).value
    assert type(lost) is MeshrunError
    assert detached_failure(RUN, {"h3": lost}) == (
        "host 'h3': detached start failed: agent did not start; stop what did start with: fab stop --run " + RUN)
    assert detached_failure(RUN, {"h2": busy, "h3": lost}) == (
        "host 'h2': detached start failed: already has an agent; host 'h3': detached start failed: agent did not "
        f"start; run {RUN} already runs on h2: see it with fab status --run {RUN} before you stop anything "
        f"(fab stop --run {RUN} stops all of it)")


def test_the_lock_goes_with_its_agent_and_a_detached_start_waits_for_its_own_pidfile(tmp_path: Path) -> None:
    """A killed agent leaves its pidfile and lock file; the next agent takes the lock. A detached
    start whose copy fails (no such command) says so, and does not return the stale pidfile."""
    marker = tmp_path / "first.pid"
    killed = subprocess.Popen(agent_argv("--quiet", command=[sys.executable, "-c", SLEEPER, str(marker)]),
                              cwd=tmp_path, stdin=subprocess.DEVNULL)
    worker = wait_for(lambda: read_pid(marker), 20, "the agent's command")
    # The agent writes its pidfile once its command has started (it names the command's pid): on a
    # loaded machine the command's marker came first, and a kill then left no pidfile (CI, 2026-12-07).
    pidfile = tmp_path / host_dir(RUN, "local") / AGENT_PIDFILE
    wait_for(pidfile.exists, 20, "the agent's pidfile")
    killed.kill()  # SIGKILL: no clean-up of its own; its torchrun gets SIGTERM from the kernel
    killed.wait(timeout=10)
    wait_for(lambda: not alive(worker), 20, "the killed agent's command ending")
    assert json.loads(pidfile.read_text())["agent_pid"] == killed.pid  # stale
    failed = subprocess.run(agent_argv("--detach", "--env-stdin", command=[str(tmp_path / "no-such-command")]),
                            cwd=tmp_path, input=b"{}\n", capture_output=True, timeout=30)
    assert (failed.returncode, json.loads(failed.stdout)) == (1, {
        "error": f"agent did not start; see runs/{RUN}/hosts/local/train.log"})
    started = subprocess.run(agent_argv("--detach", "--env-stdin", command=["sleep", "30"]), cwd=tmp_path,
                             input=b"{}\n", capture_output=True, timeout=30)
    record = json.loads(started.stdout)
    try:
        assert started.returncode == 0 and record["agent_pid"] != killed.pid and alive(record["agent_pid"])
        lock = tmp_path / host_dir(RUN, "local") / AGENT_LOCK
        assert lock.read_text() == f"{record['agent_pid']}\n"
    finally:
        os.kill(record["agent_pid"], signal.SIGTERM)
        wait_for(lambda: not alive(record["agent_pid"]), 20, "the detached agent ending")


def record(tmp_path: Path, detached: bool, controller_pid: int | None = None) -> Project:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  local: {address: local, nproc: 1, workdir: .}\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("local",), time.time() - 3600, detached, "127.0.0.1:29400",
              controller_pid=controller_pid).save(project.runs)
    return project


def never_asked() -> list[HostState]:
    raise AssertionError("a host was asked")


def test_the_resume_refusal_of_a_detached_run_whose_hosts_say_running_is_one_exact_line(tmp_path: Path) -> None:
    project = record(tmp_path, detached=True)
    saved = train_cmd.load_record(project.runs, RUN)
    states = [HostState(RUN, "h1", "running"), HostState(RUN, "h2", "exited"), HostState(RUN, "h3", "running")]
    with pytest.raises(InputError) as info:
        refuse_running(project.runs, saved, lambda: states)
    assert str(info.value) == (f"--resume {RUN}: the run is still running (its agents still run on h1, h3); stop it "
                               f"first with fab stop --run {RUN}, or check with fab status --run {RUN}")
    refuse_running(project.runs, saved, lambda: [HostState(RUN, "h1", "stopped"), HostState(RUN, "h2", "unreachable")])
    (project.run_home(RUN) / SUMMARY).write_text('{"best_loss": 0.33}\n')  # a script's file of that name
    with pytest.raises(InputError):
        refuse_running(project.runs, saved, lambda: states)
    (project.run_home(RUN) / SUMMARY).write_text(json.dumps({"run_id": RUN, "status": "succeeded"}))
    refuse_running(project.runs, saved, never_asked)  # ended: nobody is asked


def test_an_attached_run_is_refused_while_its_controller_runs_and_no_host_is_asked(tmp_path: Path) -> None:
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fab", "train"])
    try:
        project = record(tmp_path, detached=False, controller_pid=controller.pid)
        with pytest.raises(InputError) as info:
            refuse_running(project.runs, train_cmd.load_record(project.runs, RUN), never_asked)
        assert str(info.value) == (
            f"--resume {RUN}: the run is still running (its controller, pid {controller.pid} on this machine, "
            f"still watches it); stop it first with fab stop --run {RUN}, or check with fab status --run {RUN}")
    finally:
        controller.kill()
        controller.wait()
    # Its controller gone: its agents stop by themselves, and a new agent refuses while one still runs.
    refuse_running(project.runs, train_cmd.load_record(project.runs, RUN), never_asked)


def test_fab_train_resume_asks_a_detached_runs_real_host_and_resumes_it_once_stopped(tmp_path: Path, first) -> None:  # type: ignore[no-untyped-def]
    """The local host's real agent answers `status`: running, so the resume is refused before it
    changes anything; once `stop` ended it, the same resume goes on with the record's defaults."""
    agent, worker = first
    project = record(tmp_path, detached=True)
    request = train_cmd.TrainRequest(None, None, Workload(), resume=RUN)
    with pytest.raises(InputError) as info:
        train_cmd._with_resumed_defaults(request, project, Renderer())
    assert str(info.value) == (f"--resume {RUN}: the run is still running (its agents still run on local); stop it "
                               f"first with fab stop --run {RUN}, or check with fab status --run {RUN}")
    assert alive(worker) and not (project.run_home(RUN) / "summary.prev.json").exists()
    stopped = subprocess.run([sys.executable, "-m", AGENT_MODULE, "stop", "--host", "local", "--run-id", RUN],
                             cwd=tmp_path, capture_output=True, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    agent.wait(timeout=20)
    resumed = train_cmd._with_resumed_defaults(request, project, Renderer())
    assert (resumed.inventory, resumed.hosts) == (str(tmp_path / "hosts.yaml"), "local")
