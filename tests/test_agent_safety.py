"""The host agent never signals a stranger, and never leaves workers behind when it dies (issue 12,
hole 8). Real processes on this machine: the agent, real torchrun, real process groups."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.host.procs import alive, start_time, terminate_run
from meshrun.layout import EXIT_RECORD, TORCHRUN_MODULE, host_dir
from tests.testbed.proc import argv_of

REPO = Path(__file__).resolve().parents[1]

SLEEPER = """import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""

# The leader forks a member into its group and exits; nobody reaps it, so it stays a zombie that
# still leads a group with a live member: a stranger's group whose leader looks dead.
ZOMBIE_LEADER = """import os, sys, time
if os.fork() == 0:
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(600)
os._exit(0)
"""


def tagged(run_id: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MESHRUN_RUN_ID={run_id}".encode() in env and alive(int(entry)):
            found.append(int(entry))
    return found


def wait_for_file(path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.2)
    raise AssertionError(f"{path} never appeared")


def test_a_group_whose_leader_is_a_strangers_zombie_is_not_signalled(tmp_path: Path) -> None:
    """Recorded pgid and start time name our torchrun; the number now leads a stranger's group
    (its leader a zombie, a member alive). The old check took a non-live leader for ours."""
    marker = tmp_path / "member"
    leader = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER, str(marker)], start_new_session=True)
    member = wait_for_file(marker, 30)
    try:
        deadline = time.monotonic() + 10
        while alive(leader.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(leader.pid) and start_time(leader.pid) is not None  # a zombie leader
        ours_was = start_time(leader.pid) + 1  # what our own torchrun's start time would have been
        terminate_run("not-this-run", "h1", leader.pid, 0.5, ours_was)
        time.sleep(0.5)
        assert alive(member), "the stranger's group was signalled"
        # With the right start time it is ours, and the whole group goes.
        terminate_run("not-this-run", "h1", leader.pid, 0.5, start_time(leader.pid))
        deadline = time.monotonic() + 10
        while alive(member) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(member)
    finally:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leader.wait()


@pytest.mark.slow
def test_torchrun_and_workers_die_with_a_killed_agent(tmp_path: Path) -> None:
    """SIGKILL of the agent (no chance to clean up): torchrun (meshrun's, as every run starts it)
    gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and takes its worker with it."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    marker = tmp_path / "worker.pid"
    run_id = "pdeathsig-" + os.urandom(3).hex()
    torchrun = [sys.executable, "-m", TORCHRUN_MODULE, "--standalone", "--nproc-per-node", "1",
                "--log-dir", str(tmp_path / "torchrun-logs"), str(script), str(marker)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host", "local",
                              "--heartbeat-timeout", "0", "--quiet", "--", *torchrun],
                             cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        worker = wait_for_file(marker, 120)
        assert alive(worker) and len(tagged(run_id)) >= 2  # torchrun and its worker
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 60
        while tagged(run_id) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = tagged(run_id)
        assert not left, f"left behind by the killed agent: {left}\n{process_states(left)}"
    finally:
        for pid in tagged(run_id):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_workers_die_with_a_torchrun_killed_outright(tmp_path: Path) -> None:
    """SIGKILL of torchrun itself (by hand, the OOM killer): torch's own torchrun leaves its worker
    running (a session of its own, nobody to stop it); meshrun's takes it along (the worker's
    parent-death signal, deploy/host/torchrun.py)."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    left = {}
    for name, module in (("torch", "torch.distributed.run"), ("meshrun", TORCHRUN_MODULE)):
        marker = tmp_path / f"{name}.pid"
        run_id = "lifeline-" + os.urandom(3).hex()
        torchrun = subprocess.Popen(
            [sys.executable, "-m", module, "--standalone", "--nproc-per-node", "1", "--log-dir",
             str(tmp_path / f"logs-{name}"), str(script), str(marker)],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "MESHRUN_RUN_ID": run_id},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            worker = wait_for_file(marker, 120)
            assert alive(worker) and torchrun.poll() is None
            torchrun.kill()
            torchrun.wait()
            deadline = time.monotonic() + (3 if name == "torch" else 30)
            while alive(worker) and time.monotonic() < deadline:
                time.sleep(0.1)
            left[name] = alive(worker)
        finally:
            for pid in tagged(run_id):
                os.kill(pid, signal.SIGKILL)
    assert left == {"torch": True, "meshrun": False}


# A torchrun whose shutdown never ends (it ignores TERM), with meshrun's orphan watch; its parent
# prints the pid and then sleeps until the test kills it.
HUNG_TORCHRUN = """import os, signal, sys, time
from meshrun.deploy.host.torchrun import end_when_orphaned
signal.signal(signal.SIGTERM, signal.SIG_IGN)
end_when_orphaned(grace_s=float(sys.argv[2]), every_s=0.1)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""
PARENT = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_torchrun_whose_shutdown_hangs_ends_once_its_parent_is_gone(tmp_path: Path) -> None:
    """The agent killed: should torch's shutdown hang, meshrun's torchrun ends itself the grace
    after its parent is gone, and not while the parent lives (deploy/host/torchrun.py)."""
    ready = tmp_path / "ready"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, HUNG_TORCHRUN, str(ready), "2"],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert wait_for_file(ready, 60) == child
        time.sleep(3)
        assert alive(child), "ended while its parent lives"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "still running 30 s after its parent died"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def process_states(pids: list[int]) -> str:
    """What a process left behind is doing, for the failure message: its command, parent, signal
    masks (a SIGTERM pending but blocked, or no handler) and where each of its threads waits."""
    lines = []
    for pid in pids:
        try:
            command = " ".join(argv_of(pid))[:300]
            status = {k: v.strip() for k, v in (line.split(":", 1) for line in
                                                 Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)}
            lines.append(f"{pid}: {command}; " + ", ".join(f"{k} {status.get(k)}" for k in
                                                           ("State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
            for task in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                state = stat[stat.rindex(")") + 2]
                lines.append(f"  thread {task} {name}: {state} in {Path(f'/proc/{pid}/task/{task}/wchan').read_text()}")
        except OSError as err:
            lines.append(f"{pid}: {err}")
    return "\n".join(lines)


STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@pytest.mark.parametrize("ignored", [(), (signal.SIGHUP,), (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)],
                         ids=["none", "nohup", "all"])
def test_signal_handlers_are_in_place_before_torchrun_is_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 ignored: tuple[signal.Signals, ...]) -> None:
    """A TERM that lands between Popen and the handlers would kill the agent and orphan torchrun:
    at the moment Popen is called, the agent's stop signals must already be its own. A SIGHUP or
    SIGINT it was started ignoring (`nohup`) stays ignored, as the controller's does; SIGTERM, how
    `fab stop` asks it to stop, is its own whatever it inherited."""
    from meshrun.deploy.host import agent

    seen: dict[str, object] = {}

    def popen(*_args: object, **_kwargs: object) -> None:
        seen.update({sig.name: signal.getsignal(sig) for sig in STOPS})
        raise OSError("not started in this test")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(agent.subprocess, "Popen", popen)
    before = {sig: signal.getsignal(sig) for sig in STOPS}
    args = agent.parse(["run", "--run-id", "r1", "--host", "h1", "--heartbeat-timeout", "0", "--quiet", "--", "true"])
    args.secret_env = {}
    try:
        for sig in STOPS:  # as the agent's parent left them
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        assert agent.Supervisor(args).run() == 127
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert set(seen) == {"SIGTERM", "SIGHUP", "SIGINT"}
    own = {name for name, h in seen.items() if callable(h) and h not in before.values()}
    assert own == {"SIGTERM"} | {sig.name for sig in STOPS if sig not in ignored}, seen
    assert all(seen[sig.name] is signal.SIG_IGN for sig in ignored if sig != signal.SIGTERM), seen


def agent_started_ignoring(tmp_path: Path, run_id: str, ignored: str) -> subprocess.Popen:
    """An attached agent (heartbeats on stdin) started as `nohup` starts it, with `ignored` signals
    ignored (sh's `trap ''`, inherited through exec), in a process group of its own: a shell job's,
    which is where an `address: local` host's agent is, beside its controller (deploy/edges/transport.py)."""
    agent = [sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host", "local",
             "--heartbeat-timeout", "600", "--grace", "2", "--", sys.executable, "-c", "import time; time.sleep(600)"]
    return subprocess.Popen(["sh", "-c", f"trap '' {ignored}; exec \"$0\" \"$@\"", *agent], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def signal_sets(pid: int) -> dict[str, set[int]]:
    """The signals `pid` ignores and catches, from /proc/PID/status's SigIgn and SigCgt masks."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: {n for n in range(1, 65) if int(status[k], 16) >> (n - 1) & 1} for k in ("SigIgn", "SigCgt")}


def exit_reason(tmp_path: Path, run_id: str) -> str:
    return json.loads((tmp_path / host_dir(run_id, "local") / EXIT_RECORD).read_text())["reason"]


def wait_until_started(run_id: str) -> None:
    """Until the agent's command runs (a process tagged with the run), 60 s at most."""
    started = time.monotonic()
    while not tagged(run_id) and time.monotonic() - started < 60:
        time.sleep(0.1)
    assert tagged(run_id), "the command never started"


def test_an_agent_started_under_nohup_outlives_the_terminals_hangup(tmp_path: Path) -> None:
    """`nohup fab train` with an `address: local` host: the closed terminal's SIGHUP to the job's group
    stopped the local agent's run (it replaced the SIG_IGN it inherited), and with it the run the
    controller, ignoring the SIGHUP, went on with (a review of orphans, finding 5). The agent keeps the
    SIG_IGN and its run; the controller's end (EOF) still stops it."""
    run_id = "nohup-" + os.urandom(3).hex()
    agent = agent_started_ignoring(tmp_path, run_id, "HUP")
    assert agent.stdin is not None
    try:
        wait_until_started(run_id)
        # Its handlers are set before the command starts: what it does with SIGHUP is settled now.
        assert signal.SIGHUP in signal_sets(agent.pid)["SigIgn"], signal_sets(agent.pid)
        os.killpg(agent.pid, signal.SIGHUP)  # the terminal closes: the shell hangs up the job's group
        for _ in range(10):  # the controller ignored it: its heartbeats go on
            with contextlib.suppress(BrokenPipeError):  # an agent that stopped: said below
                agent.stdin.write(b"\n")
                agent.stdin.flush()
            time.sleep(0.2)
        assert agent.poll() is None and tagged(run_id), "the run stopped on a SIGHUP its agent was started ignoring"
        agent.stdin.close()
        assert agent.wait(timeout=60) == 128 + signal.SIGTERM
        assert exit_reason(tmp_path, run_id) == "the controller's connection closed"
        assert not tagged(run_id)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for pid in tagged(run_id):
            os.kill(pid, signal.SIGKILL)


def test_fab_stop_stops_an_agent_started_ignoring_every_stop_signal(tmp_path: Path) -> None:
    """SIGTERM is the agent's own whatever it inherited: `agent stop` (`fab stop`) asks with it. SIGHUP
    and SIGINT, inherited ignored, stay ignored and stop nothing."""
    run_id = "trapped-" + os.urandom(3).hex()
    agent = agent_started_ignoring(tmp_path, run_id, "HUP INT TERM")
    assert agent.stdin is not None
    try:
        wait_until_started(run_id)
        sets = signal_sets(agent.pid)
        assert {signal.SIGHUP, signal.SIGINT} <= sets["SigIgn"] and signal.SIGTERM in sets["SigCgt"], sets
        os.killpg(agent.pid, signal.SIGHUP)
        os.killpg(agent.pid, signal.SIGINT)
        stop = subprocess.run([sys.executable, "-m", "meshrun.deploy.host.agent", "stop", "--run-id", run_id, "--host",
                               "local", "--grace", "2"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=120)
        answer = json.loads(stop.stdout)
        assert (stop.returncode, answer["was_running"], answer["remaining"]) == (0, True, []), stop
        assert agent.wait(timeout=60) == 128 + signal.SIGTERM
        assert exit_reason(tmp_path, run_id) == "signal SIGTERM"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for pid in tagged(run_id):
            os.kill(pid, signal.SIGKILL)


def quiet_agent(tmp_path: Path, run_id: str, command: list[str]) -> subprocess.Popen:
    """A detached-style agent (no controller: no heartbeats, no output) running `command`."""
    return subprocess.Popen([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host",
                             "local", "--heartbeat-timeout", "0", "--grace", "2", "--quiet", "--", *command],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# A user's script that starts a helper the run's tags cannot find: a clean environment, a session of
# its own, its parent gone (double fork). It writes the helper's pid, then stays (or exits: `end`).
ESCAPER = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c",
                  "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)",
                  sys.argv[1]], {})
    os._exit(0)
if sys.argv[2] == "end":
    time.sleep(2)  # the helper is adopted by the agent before this command ends
    sys.exit(0)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["stopped", "end"])
def test_a_helper_that_dropped_the_runs_tags_does_not_outlive_the_run(tmp_path: Path, how: str) -> None:
    """Orphaned with a clean environment in a session of its own, the helper escaped both the process
    group and the tag scan, and kept its GPU's memory after the run (a review, 2026-12-05). The agent
    is its run's subreaper: the orphan is re-parented to it and goes when the run is stopped (TERM,
    as `fab stop` and a lost controller do) or when the command ends by itself."""
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    marker = tmp_path / "helper.pid"
    run_id = "escape-" + os.urandom(3).hex()
    agent = quiet_agent(tmp_path, run_id, [sys.executable, str(script), str(marker), how])
    helper = wait_for_file(marker, 60)
    try:
        assert alive(helper) and helper not in tagged(run_id)
        if how == "stopped":
            agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == (128 + signal.SIGTERM if how == "stopped" else 0)
        deadline = time.monotonic() + 10
        while alive(helper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(helper), f"the helper outlived the run: {process_states([helper])}"
    finally:
        if alive(helper):
            os.kill(helper, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()


def test_a_controller_that_stopped_reading_does_not_hold_the_stop(tmp_path: Path) -> None:
    """A cut link: the agent's stdout (its SSH channel) fills and a write blocks until TCP gives up,
    about 15 min. The command prints without end and nobody reads the agent's stdout or sends a
    heartbeat: the agent must still stop its run at the heartbeat timeout. It wrote to the
    controller in the watch loop, behind the tee thread blocked in a write (a review, 2026-12-05)."""
    chatter = tmp_path / "chatter.py"
    chatter.write_text("import sys\nwhile True:\n    sys.stdout.write('x' * 1000 + '\\n')\n")
    run_id = "unread-" + os.urandom(3).hex()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host",
                              "local", "--heartbeat-timeout", "3", "--grace", "2", "--", sys.executable, str(chatter)],
                             cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    try:
        started = time.monotonic()
        while not tagged(run_id) and time.monotonic() - started < 30:
            time.sleep(0.1)
        assert tagged(run_id), "the command never started"
        deadline = time.monotonic() + 60
        while agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.poll() == 128 + signal.SIGTERM, "the agent did not stop its run with its stdout unread"
        assert not tagged(run_id)
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in tagged(run_id):
            os.kill(pid, signal.SIGKILL)
        agent.communicate(timeout=30)


ORPHAN_THAT_EXITS = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[1], "w").write(str(os.getpid()))
        os._exit(0)
    os._exit(0)
time.sleep(600)
"""


def test_the_agent_reaps_the_orphans_it_adopts(tmp_path: Path) -> None:
    """As its run's subreaper the agent inherits a script's orphans; one that exits must not stay a
    zombie (each holds a pid against the host's limit until the agent ends; init reaped them before)."""
    from meshrun.deploy.host.procs import children

    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_THAT_EXITS)
    marker = tmp_path / "orphan.pid"
    agent = quiet_agent(tmp_path, "reap-" + os.urandom(3).hex(), [sys.executable, str(script), str(marker)])
    try:
        orphan = wait_for_file(marker, 60)
        assert children(agent.pid), "no /proc/PID/task/*/children here: nothing to test the reaping with"
        deadline = time.monotonic() + 10
        while orphan in children(agent.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert orphan not in children(agent.pid), f"a zombie under the agent: {process_states([orphan])}"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
