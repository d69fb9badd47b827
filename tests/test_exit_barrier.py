"""A torchrun whose workers are done waits in torch's exit barrier for the other hosts, up to 300 s;
a peer gone meanwhile must not keep it (and `fab train`) there (deploy/host/exitbarrier.py).

The rule on its own (a real mark file, worker pids given), torch's real elastic agent creating the
mark (two real torchruns on this machine, one still running), and the whole path on the simulated
cluster: h1's worker ends at once, h2's holds, h2 is killed, and the run ends in seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun import layout
from meshrun.deploy.host import torchrun as entry
from meshrun.deploy.host.exitbarrier import ExitBarrier
from tests.fabrun import FabProcess, run_id_of, wait_no_run_processes
from tests.runrecords import summary_of


class Workers:
    def __init__(self) -> None:
        self.pids: list[int] = []

    def __call__(self) -> list[int]:
        return list(self.pids)


def test_a_peer_gone_while_torchrun_waits_in_its_barrier_releases_it(tmp_path: Path) -> None:
    workers = Workers()
    barrier = ExitBarrier(tmp_path / "mark", workers)
    assert not barrier.release()  # nothing reported
    barrier.mark.touch()
    assert barrier.waiting() and not barrier.release()  # waiting, but nobody is gone: torch's barrier decides
    barrier.peer_gone()
    assert barrier.release()
    barrier.new_torchrun()
    assert not barrier.mark.exists() and barrier.pending is None and not barrier.release()


def test_a_peer_gone_while_the_group_ran_counts_once_that_group_succeeds(tmp_path: Path) -> None:
    workers = Workers()
    barrier = ExitBarrier(tmp_path / "mark", workers)
    workers.pids = [11, 12]
    barrier.peer_gone()
    workers.pids = [12]  # one rank done, the other still at work: the same group
    assert not barrier.release() and barrier.pending == {11, 12}
    workers.pids = []
    barrier.mark.touch()
    assert barrier.release()


def test_a_peer_gone_before_the_current_group_started_does_not_count(tmp_path: Path) -> None:
    """The loss restarted the workers (a re-rendezvous without the peer): the new group's own
    success waits for its own peers, as torch's barrier does."""
    workers = Workers()
    barrier = ExitBarrier(tmp_path / "mark", workers)
    workers.pids = [11, 12]
    barrier.peer_gone()
    workers.pids = []  # killed by the restart; torchrun re-rendezvouses
    assert not barrier.release() and barrier.pending == {11, 12}
    workers.pids = [21, 22]  # the new group
    assert not barrier.release() and barrier.pending is None
    workers.pids = []
    barrier.mark.touch()
    assert not barrier.release()


def test_the_mark_is_written_by_torchs_agent_entering_its_exit_barrier_not_before(tmp_path: Path) -> None:
    """Two real torchruns, one rendezvous on this machine: node A's worker ends at once and
    node B's holds; A's torchrun marks the file while it waits for B, its worker did not inherit
    the variable, and B's torchrun, not told of any file, creates none."""
    (tmp_path / "work.py").write_text(
        "import os, sys, time\n"
        f"print('inherited', {layout.TORCHRUN_EXIT_MARK_ENV!r} in os.environ, flush=True)\n"
        "time.sleep(float(sys.argv[1]))\n")
    port = free_port()
    mark = tmp_path / "mark"

    def start(node: str, hold: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", layout.TORCHRUN_MODULE, "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "barrier",
             "--max-restarts", "0", "--log-dir", str(tmp_path / f"logs-{node}"), "--tee", "3", "work.py", hold],
            cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)

    ends_first = start("a", "0", {layout.TORCHRUN_EXIT_MARK_ENV: str(mark)})
    holds = start("b", "60", {})
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and ends_first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), "no mark"
        assert ends_first.poll() is None and holds.poll() is None  # A waits for B, in torch's barrier
    finally:
        out_b, out_a = stop(holds, 30), stop(ends_first, 2)
    assert "inherited False" in out_a and "inherited False" in out_b, out_a[-2000:] + out_b[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mark")) == ["mark"]


def test_a_torch_without_an_exit_barrier_is_left_as_it_is(tmp_path: Path) -> None:
    class Agent:
        pass

    api = type("api", (), {"SimpleElasticAgent": Agent})
    assert not entry.mark_exit_barrier(api, str(tmp_path / "mark"))
    assert not hasattr(Agent, "_exit_barrier")


def stop(torchrun: subprocess.Popen[str], wait_s: float) -> str:
    """TERM: torchrun stops its workers (in sessions of their own) and ends; KILL if it does not
    (one in its exit barrier does not: it sits in the store's wait, measured 30 s of 30)."""
    os.killpg(torchrun.pid, signal.SIGTERM)
    try:
        return torchrun.communicate(timeout=wait_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(torchrun.pid, signal.SIGKILL)
        return torchrun.communicate()[0]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.cluster
@pytest.mark.either_cluster
def test_a_host_killed_while_the_other_waits_in_its_exit_barrier_ends_the_run_in_seconds(testbed, inventory: Path) -> None:
    """h1's worker ends at once, h2's holds; h2 is killed (its sshd sessions too) while h1's
    torchrun waits for it in torch's exit barrier. h1's agent ends that wait when the controller
    reports h2 gone; the run ends with h1 finished, h2 lost, and nothing left of it. Without the
    release it ended 300 s later (torch's barrier timeout): seen with the release taken out."""
    run = FabProcess("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--nnodes", "1:2", "--skip-checks",
                     "--script", "tests/scripts/end_unevenly.py", "--", "h1", "600")
    try:
        run_id = run_id_of(run.wait_for(r"\[h2:\d\] UNEVEN holding", timeout=240))
        mark = f"/root/meshrun/runs/{run_id}/hosts/h1/{layout.EXIT_BARRIER_MARK}"
        deadline = time.monotonic() + 120
        while testbed.exec(1, ["test", "-e", mark], check=False).returncode != 0:
            assert time.monotonic() < deadline, run.output[-3000:]
            time.sleep(0.5)
        assert testbed.kill_processes(2)
        assert run.finish(timeout=120) == 0, run.output[-4000:]
    finally:
        run.close()
    assert "meshrun: h2 lost" in run.output
    assert "[h1] meshrun-agent: this host's workers had finished; a peer it waited for is gone" in run.output, \
        run.output[-3000:]
    summary = summary_of(run_id)
    assert summary["status"] == "succeeded" and summary["lost_hosts"] == ["h2"], summary
    wait_no_run_processes(run_id, timeout=30)
