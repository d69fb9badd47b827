"""A Ctrl-C during `fab train --detach`'s agent start (an interruption review, finding 3).

The starts ran on `on_each`, whose threads went on after the Ctrl-C: the console said
"interrupted" and exited 130 while every host's agent started and trained on, holding its GPUs,
with no provenance written and nothing said. Now the starts run on `start_each` (no more begin,
those in flight are waited for) and the hosts whose agents started are named and stopped. Fake
sessions stand in for SSH (what is under test is the controller's bookkeeping; the detached agent
itself is tested on real processes in tests/test_agent_lock.py), and the stop's SSH fan-out is
replaced by one that records whom it was asked to stop."""

from __future__ import annotations

import _thread
import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from meshrun.deploy.edges import agents, detachedstart
from meshrun.deploy.edges.fanout import HostResults
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from tests.fakesession import FakeSession, host

RUN = "20260101-000000-cafe"


def test_a_ctrl_c_during_the_detached_start_names_the_hosts_whose_agents_started() -> None:
    """And those whose start failed, a busy host aside (an orphans review, finding 1): h3's "did not
    start" came from a copy that could still start torchrun after it, and the stop never reached it.
    h4 is busy: the agent there is another start's, and a stop by run id would end that run."""
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.147.17.{i}") for i in (1, 2, 3, 4))
    plan = plan_launch(Selection(hosts, Rendezvous("h1", 29400)), LaunchOptions(RUN, detach=True), {}, "/v/python")

    began = {name: threading.Event() for name in ("h1", "h2", "h3", "h4")}
    interrupted = threading.Event()

    def answer(name: str, interrupt: bool = False) -> FakeSession:
        def stdout(_argv: object) -> str:
            began[name].set()
            if interrupt:  # once every start has begun (events, not sleeps: it holds on a loaded machine)
                assert all(event.wait(30) for event in began.values())
                _thread.interrupt_main()
                interrupted.set()
            assert interrupted.wait(30)  # still in flight when the Ctrl-C arrives
            time.sleep(0.2)
            if name == "h3":
                return json.dumps({"error": "agent did not start; see train.log"})
            if name == "h4":
                return json.dumps({"error": "run already has an agent on host 'h4'", "busy": True})
            return json.dumps({"run_id": RUN, "agent_pid": 4242})
        return FakeSession(stdout, the_host=next(h for h in hosts if h.name == name))

    sessions = {"h1": answer("h1"), "h2": answer("h2"), "h3": answer("h3", interrupt=True), "h4": answer("h4")}
    # Python's own SIGINT handler: a pytest-xdist worker ignores SIGINT, and interrupt_main() then raises nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(detachedstart.StartInterrupted) as info:
            detachedstart.start_detached(plan, sessions)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (info.value.started, info.value.unsure) == (("h1", "h2"), ("h3",))
    assert isinstance(info.value, KeyboardInterrupt)  # the CLI's Ctrl-C path: exit 130, one line


def test_the_hosts_that_started_are_stopped_and_a_host_left_unclean_is_named(tmp_path: Path, monkeypatch,
                                                                             capsys) -> None:  # type: ignore[no-untyped-def]
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1", "h2", "h3"), time.time(), True, "10.147.17.1:29400",
              controller_pid=None).save(project.runs)
    asked: list[tuple[str, ...]] = []

    def stop_hosts(record: RunRecord, root: Path, names: tuple[str, ...]) -> HostResults:
        asked.append(names)
        assert record.run_id == RUN and root == tmp_path
        return HostResults({"h1": (), "h2": (77,), "h3": MeshrunError("host 'h3': no answer within 75 s")})

    monkeypatch.setattr(detachedstart, "stop_hosts", stop_hosts)
    detachedstart.stop_started(RUN, ("h1", "h2"), project, Renderer(), unsure=("h3",))
    detachedstart.stop_started(RUN, (), project, Renderer())
    assert asked == [("h1", "h2", "h3")]
    out = capsys.readouterr()
    text = out.out + out.err
    assert (f"interrupted: stopping run {RUN} on h1, h2, whose agents had started and h3, whose start failed (an "
            f"agent may still start there); Ctrl-C again does not cut this short") in text
    assert (f"not every host of run {RUN} is clean (stop failed: host 'h3': no answer within 75 s; host 'h2': "
            f"processes left: 77): fab stop --run {RUN}") in text


def test_a_host_that_does_not_answer_fails_alone_and_the_hint_says_to_stop_what_started() -> None:
    """A review of this change: a host whose start raised (no answer in 30 s, a dropped link) was a
    crash for start_each, which stopped handing out hosts and raised the bare error, without the
    hint to stop the agents that had started."""
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.147.17.{i}") for i in (1, 2, 3))
    plan = plan_launch(Selection(hosts, Rendezvous("h1", 29400)), LaunchOptions(RUN, detach=True), {}, "/v/python")

    def silent(_argv: object) -> str:
        raise MeshrunError("host 'h2': no answer within 30 s")

    asked: list[str] = []

    def answering(name: str) -> FakeSession:
        def stdout(_argv: object) -> str:
            asked.append(name)
            return json.dumps({"run_id": RUN, "agent_pid": 4242})
        return FakeSession(stdout, the_host=next(h for h in hosts if h.name == name))

    sessions = {"h1": answering("h1"), "h2": FakeSession(silent, the_host=hosts[1]), "h3": answering("h3")}
    with pytest.raises(MeshrunError) as info:
        detachedstart.start_detached(plan, sessions, ())
    assert str(info.value) == f"host 'h2': no answer within 30 s; stop what did start with: fab stop --run {RUN}"
    assert sorted(asked) == ["h1", "h3"]


def test_a_second_ctrl_c_does_not_cut_the_stop_of_the_started_hosts_short(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An orphans review, finding 2: the stop after a Ctrl-C takes seconds (a handshake per host, the
    agent's grace), and a second Ctrl-C raised out of its wait: the fan-out's threads died before
    they sent `agent stop`, and the started hosts trained on, unsaid. The real stop_hosts, with a
    stand-in connect that holds each host's stop until the second SIGINT has been handled."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: 10.147.17.1}\n  h2: {address: 10.147.17.2}\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1", "h2"), time.time(), True, "10.147.17.1:29400",
              controller_pid=None).save(project.runs)
    handled, stopped, said = threading.Event(), [], []

    class Said(Renderer):
        def warn(self, message: str) -> None:
            said.append(message)
            if message.startswith("still stopping"):
                handled.set()
            super().warn(message)

    class Answering:
        def __init__(self, host: object) -> None:
            self.host = host

        def run(self, argv: list[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
            stopped.append((self.host.name, "stop" in argv))  # type: ignore[attr-defined]
            return CommandResult(0, json.dumps({"remaining": []}), "")

        def close(self) -> None:
            pass

    def connect(the_host, _known_hosts, _root, _timeout):  # type: ignore[no-untyped-def]
        if the_host.name == "h1":
            os.kill(os.getpid(), signal.SIGINT)  # the impatient second Ctrl-C, while both stops are in flight
        assert handled.wait(30)  # a handshake that lasts until the signal has been handled
        return Answering(the_host)

    monkeypatch.setattr(agents, "connect", connect)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C would find it
    try:
        detachedstart.stop_started(RUN, ("h1", "h2"), project, Said())
        put_back = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    except KeyboardInterrupt:
        pytest.fail(f"the second Ctrl-C cut the stop short; hosts whose stop had run: {stopped}")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(stopped) == [("h1", True), ("h2", True)]
    assert said[0].endswith("; Ctrl-C again does not cut this short")
    assert f"still stopping run {RUN} on h1, h2; Ctrl-C again does not cut this short" in said
    assert put_back  # the stop's handlers are gone with it
