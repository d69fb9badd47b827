"""A worker group's helpers do not outlive the group when it is restarted while the run goes on
(deploy/host/stopping.py): neither by meshrun's own restart (the controller's `restart` line)
nor by torch's (a worker raised, `--max-restarts`), which stops each worker by `killpg` of its own
group and so misses a helper in a session of its own, re-parented to the agent (the run's subreaper).

Real processes on this machine: the real agent, with a stand-in for torchrun and its worker groups
(plain python, no torch: a torch import costs 10-20 s of CPU). The stand-in starts each worker in a
session of its own, as torch's `SubprocessHandler` does, stops a failed group as its `close` does
(`os.killpg` of the worker's group) and starts the next group as torchrun's child; the agent sees
only processes, as with torch. Every wait polls with a generous deadline: nothing is timed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from meshrun.deploy.host.procs import alive, start_time
from meshrun.layout import AGENT_RESTART_LINE, log_path

REPO = Path(__file__).resolve().parents[1]

# torchrun's stand-in: the first group's worker fails; the group is stopped as torch stops it; a
# second group starts. argv: directory, worker script.
RESTARTING_TORCHRUN = """import os, signal, subprocess, sys
d, worker = sys.argv[1], sys.argv[2]
first = subprocess.Popen([sys.executable, worker, d, "0"], start_new_session=True)  # torch's SubprocessHandler
first.wait()
try:
    os.killpg(first.pid, signal.SIGTERM)  # SubprocessHandler.close: the worker's own group, nothing more
except ProcessLookupError:
    pass
second = subprocess.Popen([sys.executable, worker, d, "1"])  # it leads a session of its own itself, late
sys.exit(second.wait())
"""

# A worker. Attempt 0 starts a helper in a session of its own (an eval process on the GPU) and fails.
# Attempt 1 starts a helper the agent adopts (its parent, a session leader, exits: a daemon's double
# fork), and only then makes its own session: the agent takes it for a worker from that moment, so
# the look that sees the second group come is one where the second group's own adopted helper
# exists, and must spare it (it started after its worker).
WORKER = """import os, subprocess, sys, time
d, attempt = sys.argv[1], sys.argv[2]
if attempt == "0":
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(f"{d}/helper0.pid", "w").write(str(helper.pid))
    sys.exit(1)
between = os.fork()
if between == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"])
    os._exit(0)
os.waitpid(between, 0)
os.setsid()
open(f"{d}/worker1.pid", "w").write(str(os.getpid()))
time.sleep(600)
"""


def wait_for_pid(path: Path, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def wait_until(done: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    return done()


def ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children_of(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if ppid(int(entry)) == pid and alive(int(entry)):
            found.append(int(entry))
    return found


def agent_argv(run_id: str, heartbeat_timeout: str, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host", "local",
            "--heartbeat-timeout", heartbeat_timeout, "--grace", "2", "--", *command]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_torchs_own_restart_kills_the_old_groups_orphans_and_spares_the_new_groups(tmp_path: Path) -> None:
    """torch restarted the worker group (a rank failed): the first group's helper, in a session of its
    own, ran on under the agent until the run ended, holding its GPU (a review of orphans, finding 3).
    It goes when the second group comes; the second group's own adopted helper, younger than its
    worker, stays."""
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "torchrun.py").write_text(RESTARTING_TORCHRUN)
    run_id = "torch-restart-" + os.urandom(3).hex()
    command = [sys.executable, str(tmp_path / "torchrun.py"), str(tmp_path), str(tmp_path / "worker.py")]
    agent = subprocess.Popen(agent_argv(run_id, "0", command), cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watched: list[int] = []
    try:
        first_helper = wait_for_pid(tmp_path / "helper0.pid")
        second_worker = wait_for_pid(tmp_path / "worker1.pid")
        watched += [first_helper, second_worker]
        assert wait_until(lambda: not alive(first_helper)), (
            f"the failed group's helper {first_helper} still runs beside the second group "
            f"(its parent {ppid(first_helper)}, the agent {agent.pid})")
        born = start_time(second_worker)
        assert alive(second_worker) and born is not None, "the second group is gone"
        second_helpers = [p for p in children_of(agent.pid) if (start_time(p) or 0) >= born]
        watched += second_helpers
        assert len(second_helpers) == 1, f"the second group's adopted helper is gone: {children_of(agent.pid)}"
        log = tmp_path / log_path(run_id, "local")
        said = f"killed 1 process(es) the last group left running in a session of their own: {first_helper}\n"
        assert wait_until(lambda: said in log.read_text()), log.read_text()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 128 + signal.SIGTERM
        assert wait_until(lambda: not any(map(alive, watched)), 30), "the run's stop left a process behind"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        kill_all(watched)


# torchrun's stand-in for meshrun's own restart: one worker, in a session of its own; once that worker
# is killed it starts no other (torch would re-rendezvous), so nothing but the restart itself ends the
# helper. argv: directory, worker script.
STEADY_TORCHRUN = """import os, subprocess, sys, time
d, worker = sys.argv[1], sys.argv[2]
open(f"{d}/torchrun.pid", "w").write(str(os.getpid()))
subprocess.Popen([sys.executable, worker, d], start_new_session=True).wait()
time.sleep(600)
"""

# A worker whose helper the run's tags cannot find (a clean environment) and that is not the worker's
# descendant either (a session of its own, its parent gone): only the agent's adoption holds it.
ESCAPING_WORKER = """import os, sys, time
d = sys.argv[1]
between = os.fork()
if between == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], {})
    os._exit(0)
os.waitpid(between, 0)
open(f"{d}/worker.pid", "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_the_controllers_restart_kills_the_workers_and_the_orphans_they_left(tmp_path: Path) -> None:
    """The controller's `restart` line (a peer was cut): the agent SIGKILLs the workers, what they
    started, and the orphans they left with it, untagged as they may be; torchrun stays to
    re-rendezvous (docs/architecture.md, docs/security.md cite this test)."""
    (tmp_path / "worker.py").write_text(ESCAPING_WORKER)
    (tmp_path / "torchrun.py").write_text(STEADY_TORCHRUN)
    run_id = "restart-line-" + os.urandom(3).hex()
    command = [sys.executable, str(tmp_path / "torchrun.py"), str(tmp_path), str(tmp_path / "worker.py")]
    agent = subprocess.Popen(agent_argv(run_id, "600", command), cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert agent.stdin is not None
    watched: list[int] = []
    try:
        torchrun = wait_for_pid(tmp_path / "torchrun.pid")
        worker = wait_for_pid(tmp_path / "worker.pid")
        watched += [torchrun, worker]
        assert wait_until(lambda: len(children_of(agent.pid)) == 2), children_of(agent.pid)  # torchrun, the helper
        helper = next(p for p in children_of(agent.pid) if p != torchrun)
        watched.append(helper)
        assert b"MESHRUN_RUN_ID=" not in Path(f"/proc/{helper}/environ").read_bytes()
        agent.stdin.write(AGENT_RESTART_LINE)
        agent.stdin.flush()
        assert wait_until(lambda: not alive(worker) and not alive(helper)), (
            f"left by the restart: worker {alive(worker)}, the adopted helper {alive(helper)}")
        assert alive(torchrun) and agent.poll() is None
        agent.stdin.close()  # the controller's connection closes: the run stops
        assert agent.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        kill_all(watched)
