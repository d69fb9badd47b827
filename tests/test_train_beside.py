"""`fab train` runs the steps that need no answer of each other side by side
(deploy/edges/beside.py): the code sync beside the connect and the pre-flight.

In the first four tests the hosts are stand-ins: `sessions_to`, `preflight` and `sync_code` are
replaced in the train module, so what is proven is the order of the controller's own steps (the sync and the route query start before the
pre-flight ends; a pre-flight that fails waits for the sync to end whole; a sync that fails fails
the run with its own error, before any launch; the sync gets the sessions once open, and is
released at once when the connect fails). The time it saves is measured on real shaped links
by `bench/launch.py --profile far` (docs/performance.md, P1). The last test is the real thing: a
first `fab train --skip-checks` on simulated hosts that have no workdir yet, where the route query
runs beside the sync that makes it."""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import Workload
from tests.fabrun import fab, run_id_of

WAIT_S = 20.0  # a stand-in waits at most this long for the other: a serial order fails, never hangs


class Steps:
    """The stand-ins and what they saw."""

    def __init__(self, preflight_fails: str | None = None, sync_fails: str | None = None) -> None:
        self.preflight_fails, self.sync_fails = preflight_fails, sync_fails
        self.sync_started, self.preflight_started = threading.Event(), threading.Event()
        self.sync_ended = threading.Event()
        self.sync_seen_by_preflight = False
        self.session_seen: object = None
        self.routes_asked, self.routes_ended = threading.Event(), threading.Event()
        self.routes_seen_by_preflight = False
        self.planned = False

    def sync_code(self, *args: object) -> dict:
        self.sync_started.set()
        self.preflight_started.wait(WAIT_S)
        self.session_seen = args[-1].get("h1", WAIT_S)  # type: ignore[attr-defined]  # SessionsLater
        time.sleep(0.3)  # still syncing when a failed pre-flight raises
        self.sync_ended.set()
        if self.sync_fails:
            raise MeshrunError(self.sync_fails)
        return {}

    def preflight(self, *_args: object, elastic: bool = False, root: object = None) -> bool:
        self.preflight_started.set()
        self.sync_seen_by_preflight = self.sync_started.wait(WAIT_S)
        self.routes_seen_by_preflight = self.routes_asked.wait(WAIT_S)
        if self.preflight_fails:
            raise MeshrunError(self.preflight_fails)
        return False

    @contextlib.contextmanager
    def sessions_to(self, *_args: object):
        yield {"h1": "session of h1"}

    def training_interfaces(self, *_args: object) -> dict:
        self.routes_asked.set()
        self.preflight_started.wait(WAIT_S)
        time.sleep(0.3)  # still asking when a failed pre-flight raises
        self.routes_ended.set()
        return {}

    def plan_launch(self, *_args: object) -> None:
        self.planned = True
        raise MeshrunError("stop here: the launch is not what this test is about")


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("print('hello')\n")
    (root / "hosts.yaml").write_text("hosts:\n  h1: {address: 192.0.2.1}\n  h2: {address: 192.0.2.2}\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # meshrun ships a git checkout's files
    return Project(root, tmp_path / "runs")


def train(project: Project, steps: Steps, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in ("sync_code", "preflight", "sessions_to", "training_interfaces", "plan_launch"):
        monkeypatch.setattr(train_cmd, name, getattr(steps, name))
    request = train_cmd.TrainRequest(str(project.root / "hosts.yaml"), None, Workload(script="train.py"))
    with pytest.raises(MeshrunError) as raised:
        train_cmd.train(request, Renderer(), project)
    return str(raised.value)


def test_the_sync_runs_beside_the_preflight_and_a_failed_preflight_waits_for_it(project, monkeypatch):
    steps = Steps(preflight_fails="pre-flight failed: h2: no torch")
    assert train(project, steps, monkeypatch) == "pre-flight failed: h2: no torch"
    assert steps.sync_seen_by_preflight  # the sync had started before the pre-flight ended
    assert steps.sync_ended.is_set()  # ... and had ended when train gave up: the hosts' code is whole
    assert steps.routes_seen_by_preflight and steps.routes_ended.is_set()  # the routes, too, beside it
    assert not steps.planned


def test_a_failed_sync_fails_the_run_with_its_own_error_before_the_launch(project, monkeypatch):
    steps = Steps(sync_fails="host 'h2': code sync failed (rsync: No space left on device)")
    assert train(project, steps, monkeypatch) == "host 'h2': code sync failed (rsync: No space left on device)"
    assert steps.sync_seen_by_preflight
    assert not steps.planned  # nothing planned or started on a host with half the code


def test_a_passed_preflight_and_sync_go_on_to_the_launch(project, monkeypatch):
    steps = Steps()
    assert train(project, steps, monkeypatch) == "stop here: the launch is not what this test is about"
    assert steps.sync_ended.is_set() and steps.planned
    assert steps.routes_seen_by_preflight  # each host's route was asked before the pre-flight ended
    assert steps.session_seen == "session of h1"  # the sync may ask a host over the session train opened


def test_a_sync_that_waits_for_sessions_is_released_when_the_connect_fails(project, monkeypatch):
    steps = Steps()

    @contextlib.contextmanager
    def no_sessions(*_args: object):
        raise MeshrunError("host 'h2': connection refused")
        yield {}

    steps.sessions_to = no_sessions  # type: ignore[method-assign]
    steps.preflight_started.set()  # no pre-flight comes: the sync must not wait for one
    started = time.monotonic()
    assert train(project, steps, monkeypatch) == "host 'h2': connection refused"
    assert steps.sync_ended.is_set() and steps.session_seen is None
    assert time.monotonic() - started < WAIT_S  # released by the way out, not by the wait's end


def test_beside_returns_or_raises_in_the_callers_thread():
    assert Beside(lambda a, b: a + b, 2, 3).result() == 5
    failing = Beside(_fail)
    with pytest.raises(MeshrunError, match="host 'h1': gone"):
        failing.result()
    failing.settle()  # settle never raises: the caller is already failing for another reason
    started = threading.Event()
    slow = Beside(lambda: (started.set(), time.sleep(0.2), "done")[-1])
    assert started.wait(WAIT_S)  # it runs at once, beside this thread
    assert slow.result() == "done"


def _fail() -> None:
    raise MeshrunError("host 'h1': gone")


@pytest.mark.cluster
def test_a_first_run_on_hosts_without_a_workdir_needs_no_setup_or_preflight(testbed, make_inventory):
    """No pre-flight (`--skip-checks`) makes the workdir here: the route query and the sync both may
    be first to reach the host, and each must find its workdir, or make it."""
    workdir = f"~/fresh-{secrets.token_hex(3)}"
    inventory = make_inventory(defaults_overrides={"workdir": workdir})
    done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--skip-checks",
               "--script", "bench/barrier_probe.py", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert sorted(re.findall(r"BARRIER (rank=\d+)", done.stdout)) == ["rank=0", "rank=1"]
    for i in (1, 2):  # the code is where the run ran, on each host
        listed = testbed.exec(i, ["ls", f"/root/{workdir[2:]}/bench/barrier_probe.py",
                                  f"/root/{workdir[2:]}/runs/{run_id_of(done.stdout)}"], check=False)
        assert listed.returncode == 0, listed.stdout + listed.stderr
