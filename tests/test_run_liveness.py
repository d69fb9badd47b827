"""Tasks never contact the hosts of a finished or stale run unless the user names that run
(issue 14): `fab status` with no `--run` asks only about runs that may still be running, and
`fab logs` / `fab stop` with no `--run` refuse with one line instead of dialling a test bed's
or a long-gone host. The hosts here are a listening socket the test owns: no SSH connection
may ever reach it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshrun.deploy.edges.records import RunRecord, may_be_running
from meshrun.layout import HEARTBEAT_TIMEOUT_S, LAUNCH_RECORD, SUMMARY
from tests.clirun import git_project, run_meshrun
from tests.trap import dialled, listening_trap

NOW = 1_800_000_000.0


def record(*, detached: bool, started: float = NOW - 3600) -> RunRecord:
    return RunRecord("r1", "/inv.yaml", ("gpu1",), started, detached, "10.0.0.1:29400", controller_pid=4242)


@pytest.mark.parametrize(("case", "run", "has_summary", "controller_alive", "expected"), [
    ("a summary means the run ended", record(detached=True), True, False, False),
    ("a summary wins over a live controller", record(detached=False), True, True, False),
    ("a detached run without a summary may run on", record(detached=True), False, False, True),
    ("an attached run whose controller lives", record(detached=False), False, True, True),
    ("an attached run whose controller died long ago", record(detached=False), False, False, False),
    ("an attached run just started: its controller may not be recorded yet",
     record(detached=False, started=NOW - HEARTBEAT_TIMEOUT_S), False, False, True),
    ("an attached run past the agents' heartbeat timeout", record(detached=False, started=NOW - HEARTBEAT_TIMEOUT_S - 6),
     False, False, False),
])
def test_which_runs_may_still_be_running(case: str, run: RunRecord, has_summary: bool, controller_alive: bool,
                                         expected: bool) -> None:
    assert may_be_running(run, has_summary, controller_alive, NOW) is expected, case


@pytest.fixture
def trap() -> Iterator[socket.socket]:
    """A port that stands for every host of the recorded runs: any task that dials them lands here."""
    yield from listening_trap()


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


@pytest.fixture
def project(tmp_path: Path, trap: socket.socket) -> Path:
    """A project whose runs/ holds a finished detached run and a stale attached one (its `fab train`
    is gone, no summary), both on a host that is the trap."""
    root = git_project(tmp_path)
    port = trap.getsockname()[1]
    inventory = root / "inventory" / "hosts.yaml"
    inventory.parent.mkdir()
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inventory.write_text(f"hosts:\n  gpu1:\n    address: 127.0.0.1\n    port: {port}\n    user: nobody\n"
                         f"    identity: {key}\nknown_hosts: inventory/known_hosts\n")
    (root / "inventory" / "known_hosts").write_text("")
    started = time.time() - 3600
    for run_id, detached, summary in (("20261130-100000-aaaa", True, True), ("20261130-110000-bbbb", False, False)):
        rec = RunRecord(run_id, str(inventory), ("gpu1",), started, detached, f"127.0.0.1:{port}",
                        controller_pid=None if detached else dead_pid())
        rec.save(root / "runs")
        if summary:
            (root / "runs" / run_id / SUMMARY).write_text(json.dumps({"run_id": run_id, "status": "succeeded"}))
        assert (root / "runs" / run_id / LAUNCH_RECORD).exists()
    return root


def meshrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, *args, ssh_config=None, stdin=None)


def test_status_logs_and_stop_leave_finished_and_stale_runs_alone(project: Path, trap: socket.socket) -> None:
    status = meshrun("status", cwd=project)
    assert (status.returncode, status.stderr) == (0, "")
    assert "no run may still be running; name an older one with --run ID (the newest is 20261130-110000-bbbb)" in status.stdout
    as_json = meshrun("status", "--json", cwd=project)
    assert (as_json.returncode, json.loads(as_json.stdout)) == (0, [])
    refusal = ("error: no recorded run may still be running; name one with --run ID "
               "(the newest is 20261130-110000-bbbb)\n")
    for task in ("logs", "stop"):
        done = meshrun(task, cwd=project)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal), task
    assert not dialled(trap)


def test_naming_a_run_does_contact_its_hosts(project: Path, trap: socket.socket) -> None:
    """The other side of the rule, so the test above cannot pass by never dialling anyone: with
    `--run` the task does reach for the run's host (the trap hangs up, so the host is unreachable)."""
    calls: list[bool] = []

    def hang_up() -> None:
        trap.settimeout(60)
        conn, _ = trap.accept()
        calls.append(True)
        conn.close()

    answering = threading.Thread(target=hang_up, daemon=True)
    answering.start()
    done = meshrun("status", "--run", "20261130-100000-aaaa", "--json", cwd=project)
    answering.join(5)
    assert calls == [True], done.stdout + done.stderr
    assert [s["state"] for s in json.loads(done.stdout)] == ["unreachable"]


def test_no_runs_at_all_names_the_runs_dir(tmp_path: Path) -> None:
    """With nothing recorded there is no older run to name: status says where it looked, and a
    task that needs a run refuses naming that directory (here one given with --runs-dir, which the
    hint repeats: a plain `meshrun train` would record its run elsewhere)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status = meshrun("status", "--runs-dir", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert (status.returncode, status.stderr) == (0, "")
    hint = f"start one with `meshrun train --runs-dir {tmp_path / 'elsewhere'}`"
    assert f"no runs recorded under {tmp_path / 'elsewhere'}; {hint}" in status.stdout
    report = meshrun("report", "--runs-dir", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert (report.returncode, report.stderr) == (
        2, f"error: no runs recorded under {tmp_path / 'elsewhere'}; {hint}\n")
