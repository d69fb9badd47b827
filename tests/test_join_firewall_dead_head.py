"""`fab join` into a `--firewall` elastic run after its first rendezvous host died (deploy/commands/firewall.py,
deploy/edges/sessions.py, deploy/commands/membership.py).

The run record keeps generation 0's rendezvous host as the head, and `admit` opens no session to a dead
member. The firewall's route lookups built the peers' addresses from the hosts with a session only, so
asking for the dead head's address was a KeyError; and an attached run's RequestPoller let that escape
its thread, wrote no answer, and `fab join` waited 180 s to blame a controller that was alive.

Fake sessions stand in for SSH: what is under test is which routes are asked for and what each live host's
chain is filled with, and that every request gets an answer."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.commands import firewall, membership
from meshrun.deploy.commands.membership import Request, RequestPoller
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.sshtarget import ENV_SSH_CONFIG
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.firewall import Action, FirewallSpec, host_request
from tests.fakesession import host

ADDRESSES = {"gpu1": "10.147.17.1", "gpu2": "10.147.17.2", "gpu3": "10.147.17.3", "gpu4": "10.147.17.4"}
HOSTS = tuple(dataclasses.replace(host(), name=name, address=address) for name, address in ADDRESSES.items())
NO_ANSWER = json.dumps({"results": [], "error": None, "notes": []})


class OverlayHost:
    """A live member: its route to any overlay address leaves by zt0, it took SSH on port 22, and its
    firewall script ran nothing. `routes` and `requests` record what it was asked."""

    def __init__(self, the_host: Host) -> None:
        self.host = the_host
        self.routes: list[str] = []
        self.requests: list[str] = []

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        if list(argv[:1]) == ["printenv"]:
            return CommandResult(0, "10.147.17.9 50000 10.147.17.2 22\n", "")
        if list(argv[:4]) == ["ip", "-j", "route", "get"]:
            self.routes.append(argv[4])
            return CommandResult(0, json.dumps([{"dst": argv[4], "dev": "zt0"}]), "")
        self.requests.append(argv[-1])  # the firewall script: `python -c SCRIPT REQUEST`
        return CommandResult(0, NO_ANSWER + "\n", "")


def test_a_firewall_up_without_the_dead_rendezvous_host_fills_every_live_chain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SSH_CONFIG, "/dev/null")  # the SSH port is the inventory's, no user config read
    live = {h.name: OverlayHost(h) for h in HOSTS[1:]}  # gpu1, the run's first rendezvous host, died
    selection = Selection(HOSTS, Rendezvous("gpu1", 29400))
    answers = firewall.apply(Action.UP, selection, live)  # type: ignore[arg-type]
    assert sorted(answers) == ["gpu2", "gpu3", "gpu4"]
    # Each asks its route to the dead head's overlay address: the interface the members' traffic takes.
    assert {name: fake.routes for name, fake in live.items()} == {name: ["10.147.17.1"] for name in live}
    spec = FirewallSpec((22,), "zt0", tuple(ADDRESSES.values()))
    assert {name: fake.requests for name, fake in live.items()} == {
        name: [host_request(Action.UP, spec)] for name in live}


RUN = "20261206-120000-abcd"


def test_a_join_that_hits_a_bug_is_answered_at_once_and_its_traceback_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # deploy/cli.debug_log's folder
    project = Project(tmp_path, tmp_path / "runs")
    record = RunRecord(RUN, str(tmp_path / "inv.yaml"), ("gpu1", "gpu2"), time.time(), False, "10.147.17.1:29400",
                       RUN, (1, 4), firewall=True)
    poller = RequestPoller(record, None, project, Renderer())  # type: ignore[arg-type]

    def join(runner: object, name: str) -> str:
        return {"gpu2": "10.147.17.2"}["gpu1"]  # the KeyError training_interfaces raised

    monkeypatch.setattr(poller, "_join", join)
    directory = membership.requests_dir(project, RUN)
    directory.mkdir(parents=True)
    request = Request("join", "gpu4", directory / "1.000-abcd-join-gpu4.json")
    poller._handle(object(), request)  # type: ignore[arg-type]
    log = tmp_path / "cache" / "meshrun" / "debug.log"
    answer = json.loads(request.path.with_name(request.path.stem + ".done.json").read_text())
    assert answer == {"ok": False, "message": f"host 'gpu4': join failed: internal error: KeyError: 'gpu1'; "
                                              f"traceback in {log}"}
    assert "Traceback (most recent call last)" in log.read_text() and "KeyError: 'gpu1'" in log.read_text()
    # `fab join`'s side reads it as the controller's word, not as "the controller did not answer".
    assert membership._answer(request.path.with_name(request.path.stem + ".done.json")) == answer
