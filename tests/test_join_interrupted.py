"""A `fab join` cut short leaves nothing behind that no command reaches (deploy/commands/membership.py,
deploy/commands/firewall.py).

- A join into a `--firewall` run raises the joiner's chain (`admit`) before it connects and syncs; the
  joiner reaches the run record only once started. A join that then failed, or a controller
  interrupted during the joiner's sync, left that chain up for good: the run's end takes down the
  chains of the hosts its record lists. And a join thread that went on after the controller had
  stopped every host started an agent on the joiner after "every host is clean".
- A detached join listed its host only after the agent's start answered: a Ctrl-C while that start
  waited for the agent's pidfile left it training where no `fab stop|status|leave` looked.

What needs an SSH host or root is stood in for (the SSH connect and sync, the iptables runs, the
agent's detached start); the run records are real files, and the detached join's hosts are this
machine (`address: local`) with the real agent answering `stop` and `status`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrun.deploy.commands import firewall, membership
from meshrun.deploy.commands.membership import Request, RequestPoller, join_or_leave
from meshrun.deploy.edges import agents
from meshrun.deploy.edges.records import RunRecord, load_record
from meshrun.deploy.edges.sshtarget import ENV_SSH_CONFIG
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.layout import ENV_HOST, ENV_RUN_ID

RUN = "20261206-120000-abcd"
MEMBERS = ("h1", "h2", "h3")  # every chain `admit` refills when h3 joins h1 and h2
INVENTORY = """\
hosts:
  h1: {address: 10.0.0.1}
  h2: {address: 10.0.0.2}
  h3: {address: 10.0.0.3}
"""


@pytest.fixture(autouse=True)
def no_bracket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own process-wide state: no --firewall run yet, and no user ssh_config read."""
    monkeypatch.setattr(firewall, "_bracket", None)
    monkeypatch.setenv(ENV_SSH_CONFIG, "/dev/null")


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    return Project(tmp_path, tmp_path / "runs")


def attached(project: Project) -> RunRecord:
    """h1 and h2 run a --firewall run watched by this process, its controller."""
    record = RunRecord(RUN, str(project.root / "inv.yaml"), ("h1", "h2"), time.time(), False, "10.0.0.1:29400",
                       RUN, (1, 4), controller_pid=os.getpid(), firewall=True)
    record.save(project.runs)
    return record


class Firewall:
    """Stands in for the iptables runs on the hosts: `log` holds each host-side `apply` once it is
    done, as ("apply", action, hosts), and each whole `fab firewall` of around_run, as ("fab", action,
    hosts). `hold_up` makes the joiner's `up` take that long."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_up: float = 0.0) -> None:
        self.log: list[tuple[str, str, object]] = []
        self.upping = threading.Event()

        def apply(action, selection, sessions):  # type: ignore[no-untyped-def]
            names = tuple(h.name for h in selection.hosts)
            if action is firewall.Action.UP:
                self.upping.set()
                time.sleep(hold_up)
            self.log.append(("apply", action.value, names))
            return {}

        @contextlib.contextmanager
        def sessions_to(hosts, inventory, root):  # type: ignore[no-untyped-def]
            yield {h.name: SimpleNamespace() for h in hosts}

        def open_sessions(hosts, inventory, root, timeout):  # type: ignore[no-untyped-def]
            return {h.name: SimpleNamespace() for h in hosts}, {}

        def whole(request, renderer, project):  # type: ignore[no-untyped-def]
            self.log.append(("fab", request.action, request.hosts))
            return 0

        monkeypatch.setattr(firewall, "apply", apply)
        monkeypatch.setattr(firewall, "sessions_to", sessions_to)
        monkeypatch.setattr(firewall, "open_sessions", open_sessions)
        monkeypatch.setattr(firewall, "close_all", lambda sessions: None)
        monkeypatch.setattr(firewall, "firewall", whole)


class Joiner:
    """Stands in for the SSH side of preparing the joiner: its session, and its code sync (`sync`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sync=lambda: None) -> None:  # type: ignore[no-untyped-def]
        self.connected: list[str] = []
        self.closed: list[str] = []

        def connect(host, known_hosts, root):  # type: ignore[no-untyped-def]
            self.connected.append(host.name)
            return SimpleNamespace(close=lambda: self.closed.append(host.name))

        monkeypatch.setattr(membership, "connect", connect)
        monkeypatch.setattr(membership, "sync_code", lambda hosts, inventory, project, renderer: sync())
        monkeypatch.setattr(membership, "route_dev", lambda session, address: "")


class Runner:
    """The attached controller's JobRunner as a join thread uses it; `stopping` is set by its stop_all."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.stopping = threading.Event()

    def claim(self, name: str) -> None:
        return None

    def unclaim(self, name: str) -> None:
        pass

    def add_host(self, launch, session) -> None:  # type: ignore[no-untyped-def]
        self.added.append(launch.host.name)


def poller_and_request(project: Project, record: RunRecord) -> tuple[RequestPoller, Request]:
    poller = RequestPoller(record, load_inventory(Path(record.inventory), project.root), project, Renderer())
    directory = membership.requests_dir(project, RUN)
    directory.mkdir(parents=True)
    return poller, Request("join", "h3", directory / "1.000-abcd-join-h3.json")


def answer_of(request: Request) -> dict:
    return json.loads(request.path.with_name(request.path.stem + ".done.json").read_text())


ENDING = {"ok": False, "message": f"host 'h3': run {RUN} is ending; nothing started"}


def test_a_join_that_fails_after_admit_takes_the_joiners_chain_down(project: Project,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fw = Firewall(monkeypatch)

    def sync() -> None:
        raise MeshrunError("host 'h3': code sync failed: rsync: connection unexpectedly closed")

    joiner = Joiner(monkeypatch, sync)
    record = attached(project)
    poller, request = poller_and_request(project, record)
    runner = Runner()
    poller._handle(runner, request)  # type: ignore[arg-type]
    assert answer_of(request) == {"ok": False, "message": "host 'h3': code sync failed: rsync: connection "
                                                          "unexpectedly closed"}
    assert fw.log == [("apply", "up", MEMBERS), ("apply", "down", ("h3",))]
    assert (joiner.connected, joiner.closed, runner.added) == (["h3"], ["h3"], [])
    assert load_record(project.runs, RUN) == record


def test_a_join_whose_admit_fails_on_a_member_takes_the_joiners_chain_down(project: Project,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A review: `admit`'s `up` runs on every member and the joiner at once, so the joiner's chain may
    be up when a member fails (or a Ctrl-C comes); `admit` was outside the join's let-go."""
    fw = Firewall(monkeypatch)
    real = firewall.apply

    def apply(action, selection, sessions):  # type: ignore[no-untyped-def]
        real(action, selection, sessions)  # the recorder: the joiner's chain is up with the others
        if action is firewall.Action.UP:
            raise MeshrunError("host 'h2': the firewall script failed: iptables: Resource temporarily unavailable")
        return {}

    monkeypatch.setattr(firewall, "apply", apply)
    joiner = Joiner(monkeypatch)
    poller, request = poller_and_request(project, attached(project))
    runner = Runner()
    poller._handle(runner, request)  # type: ignore[arg-type]
    assert answer_of(request)["ok"] is False
    assert fw.log == [("apply", "up", MEMBERS), ("apply", "down", ("h3",))]
    assert (joiner.connected, runner.added) == ([], [])


def test_a_controller_interrupted_during_the_joiners_sync_takes_its_chain_down(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while h3 syncs: the run's DOWN names h3, which no record lists yet; and the join thread,
    going on after the stop, starts no agent on h3."""
    fw = Firewall(monkeypatch)
    syncing, go_on = threading.Event(), threading.Event()
    Joiner(monkeypatch, lambda: (syncing.set(), go_on.wait(10)))
    poller, request = poller_and_request(project, attached(project))
    runner = Runner()
    join = threading.Thread(target=poller._handle, args=(runner, request))

    def run() -> int:
        join.start()
        assert syncing.wait(10)
        runner.stopping.set()  # JobRunner.stop_all: every host stopped and checked
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        firewall.around_run(str(project.root / "inv.yaml"), "h1,h2", False, run, project)
    assert fw.log == [("fab", "up", "h1,h2"), ("apply", "up", MEMBERS), ("fab", "down", "h1,h2,h3")]
    go_on.set()
    join.join(10)
    assert answer_of(request) == ENDING and runner.added == []
    assert fw.log[3:] == [("apply", "down", ("h3",))]  # the join's own: h3 ran nothing of the run
    assert load_record(project.runs, RUN).hosts == ("h1", "h2")


def test_an_admit_under_way_is_taken_down_after_and_none_starts_after(project: Project,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the members' chains are being refilled for h3: the run's DOWN waits for that `up`
    (taken down before it ended, h3's chain rose after), and a later `admit` raises nothing."""
    fw = Firewall(monkeypatch, hold_up=0.5)
    Joiner(monkeypatch)
    poller, request = poller_and_request(project, attached(project))
    runner = Runner()
    join = threading.Thread(target=poller._handle, args=(runner, request))

    def run() -> int:
        join.start()
        assert fw.upping.wait(10)
        runner.stopping.set()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        firewall.around_run(str(project.root / "inv.yaml"), "h1,h2", False, run, project)
    join.join(10)
    assert fw.log[:2] == [("fab", "up", "h1,h2"), ("apply", "up", MEMBERS)]
    # Then the run's DOWN, and the join's own of h3 (which of them comes first is the threads' race:
    # h3's already down by the join's, the run's may leave it out).
    assert sorted(fw.log[2:], key=str) in ([("apply", "down", ("h3",)), ("fab", "down", "h1,h2,h3")],
                                          [("apply", "down", ("h3",)), ("fab", "down", "h1,h2")])
    assert fw.log[2:] != [("fab", "down", "h1,h2"), ("apply", "down", ("h3",))]  # h3 down before the run's, if left out
    assert answer_of(request) == ENDING and runner.added == []
    inventory = load_inventory(project.root / "inv.yaml", project.root)
    with pytest.raises(MeshrunError) as info:
        firewall.admit(inventory, ("h1", "h2"), "h1", project, Renderer())
    assert str(info.value) == "host 'h2': the run is ending and its firewall is being taken down; nothing started"
    assert ("apply", "up", ("h1", "h2")) not in fw.log


def test_a_join_after_the_controller_began_stopping_touches_nothing(project: Project,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fw = Firewall(monkeypatch)
    joiner = Joiner(monkeypatch)
    poller, request = poller_and_request(project, attached(project))
    runner = Runner()
    runner.stopping.set()
    poller._handle(runner, request)  # type: ignore[arg-type]
    assert answer_of(request) == ENDING
    assert (fw.log, joiner.connected, runner.added) == ([], [], [])


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: a connect there is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def local(tmp_path: Path) -> tuple[Project, RunRecord]:
    """A detached run on h1, which is down (a port where nothing listens); h3, this machine, joins it."""
    root = tmp_path / "proj"
    (root / "hostdir").mkdir(parents=True)
    (root / "inv.yaml").write_text(f"hosts:\n  h1: {{address: 127.0.0.1, port: {closed_port()}, user: nobody}}\n"
                                   "  h3: {address: local, workdir: hostdir}\n")
    project = Project(root, root / "runs")
    record = RunRecord(RUN, str(root / "inv.yaml"), ("h1",), time.time(), True, "127.0.0.1:29400", RUN, (1, 2))
    record.save(project.runs)
    return project, record


def detached_start(monkeypatch: pytest.MonkeyPatch, start) -> list[str]:  # type: ignore[no-untyped-def]
    """The SSH side of a detached join stood in: preparing the joiner, and its agent's start (`start`)."""
    started: list[str] = []

    def prepare(record, inventory, name, project, renderer, detach):  # type: ignore[no-untyped-def]
        return SimpleNamespace(name=name), SimpleNamespace(close=lambda: None)

    def run_detached_agent(session, launch) -> CommandResult:  # type: ignore[no-untyped-def]
        started.append(launch.name)
        return start()

    monkeypatch.setattr(membership, "prepare_joiner", prepare)
    monkeypatch.setattr(membership, "at_generation", lambda launch, generation: launch)
    monkeypatch.setattr(membership, "run_detached_agent", run_detached_agent)
    return started


def test_a_ctrl_c_while_a_detached_agent_starts_leaves_a_host_fab_stop_reaches(
        local: tuple[Project, RunRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's copy already trains on h3 when the Ctrl-C comes: `fab stop`'s stop must reach it."""
    project, record = local
    copies: list[subprocess.Popen[bytes]] = []

    def start() -> CommandResult:
        env = {**os.environ, ENV_RUN_ID: RUN, ENV_HOST: "h3"}  # tagged as the agent tags torchrun
        copies.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env))
        raise KeyboardInterrupt  # while the start waits for the agent's pidfile

    detached_start(monkeypatch, start)
    try:
        with pytest.raises(KeyboardInterrupt):
            join_or_leave(project, record, "join", ["h3"], Renderer())
        listed = load_record(project.runs, RUN)
        assert listed.hosts == ("h1", "h3")
        stopped = agents.stop_run(listed, project.root)
        assert copies[0].wait(timeout=30) == -signal.SIGTERM
        assert stopped.ok == {"h3": ()} and list(stopped.failed) == ["h1"]  # h1 is down
    finally:
        for copy in copies:
            copy.kill()
            copy.wait()


def test_a_listed_host_whose_agent_never_started_stops_clean_and_may_join_again(
        local: tuple[Project, RunRecord], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C before the agent started anything: h3 is listed with no agent. `fab stop` finds nothing
    there, `fab status` says its agent does not know the run, and `fab join` may start it again."""
    project, record = local

    def interrupted() -> CommandResult:
        raise KeyboardInterrupt

    detached_start(monkeypatch, interrupted)
    with pytest.raises(KeyboardInterrupt):
        join_or_leave(project, record, "join", ["h3"], Renderer())
    listed = load_record(project.runs, RUN)
    assert listed.hosts == ("h1", "h3")
    assert agents.stop_run(listed, project.root).ok == {"h3": ()}
    states = {s.host: (s.state, s.detail) for s in agents.host_states(listed, project.root)}
    assert states["h3"] == ("unknown", "the agent does not know this run")
    started = detached_start(monkeypatch, lambda: CommandResult(0, "{}", ""))
    assert join_or_leave(project, listed, "join", ["h3"], Renderer()) == ["started detached on h3"]
    assert started == ["h3"] and load_record(project.runs, RUN).hosts == ("h1", "h3")


@pytest.mark.parametrize("answer,downs", [
    ('{"error": "agent did not start; see train.log"}', [("apply", "down", ("h3",))]),
    ('{"error": "run already has an agent on h3", "busy": true}', []),  # that agent runs there, fenced
])
def test_a_failed_detached_start_into_a_firewall_run_takes_the_chain_down(
        project: Project, monkeypatch: pytest.MonkeyPatch, answer: str, downs: list) -> None:
    """A --firewall run whose controller is gone is joined directly, as a detached run is."""
    fw = Firewall(monkeypatch)
    record = dataclasses.replace(attached(project), controller_pid=None)
    record.save(project.runs)
    monkeypatch.setattr(agents, "host_states", lambda record, root: [])
    detached_start(monkeypatch, lambda: CommandResult(1, answer + "\n", ""))
    with pytest.raises(MeshrunError) as info:
        join_or_leave(project, record, "join", ["h3"], Renderer())
    # The agent's own words (its JSON on stdout): the message used its empty stderr.
    assert str(info.value) == f"host 'h3': detached start failed: {json.loads(answer)['error']}"
    assert fw.log == downs
    after = load_record(project.runs, RUN)
    assert after.hosts == ("h1", "h2", "h3")  # only ever added: stop reaches it
    # A review: a failed joiner stayed a member, so a bare `fab train --resume` launched on it; not
    # when busy, since that host runs the run (another join's agent).
    assert after.members == (("h1", "h2") if downs else ("h1", "h2", "h3"))
