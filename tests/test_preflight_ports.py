"""The rendezvous port on every host that may host a run's store (findings shared-hosts #3 and #4).

An elastic run's store moves down the succession order when its host is lost, and each successor
then opens the inventory's fixed `rendezvous.port` with `is_host=1`: another run's store there
fails the failover. So the pre-flight has every successor's listener bind the port (and let it go
at once), and the host stamp of every store host says whether the port is free now, so a passed
pre-flight is not reused over a busy port.

Pure parts by exact equality; the host probes (deploy/host/links.py, stamp.py) as real processes
and sockets on loopback; the controller's fan-out over fake sessions that record what each host
was asked (tests/fakesession.py), or over this machine running the real stamp probe.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.ports import (STAMP_STATES, stamp_port, store_hosts, successor_findings,
                                        successor_names)
from meshrun.deploy.check.verdicts import Fingerprint, HostFacts, RendezvousFacts
from meshrun.deploy.commands import check
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.preflightcache import host_stamps, load_pass
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from tests.test_probe_listener import listener as probe_listener
from tests.fakesession import FakeSession, host

REPO = Path(__file__).resolve().parents[1]
LINKS, STAMP = REPO / "deploy" / "host" / "links.py", REPO / "deploy" / "host" / "stamp.py"
TRAINING = "127.0.0.2"


def node(name: str, address: str) -> Host:
    return dataclasses.replace(host(), name=name, address=address)


GPU1, GPU2, GPU3 = node("gpu1", "10.9.0.1"), node("gpu2", "10.9.0.2"), node("gpu3", "10.9.0.3")
THREE = Selection((GPU1, GPU2, GPU3), Rendezvous(None, 29400))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- who hosts the store, and the verdict (pure) ---

def test_an_elastic_run_needs_the_port_on_every_host_of_its_succession() -> None:
    assert store_hosts(THREE, elastic=False) == (GPU1,)
    assert store_hosts(THREE, elastic=True) == (GPU1, GPU2, GPU3)
    named = Selection((GPU1, GPU2, GPU3), Rendezvous("gpu2", 29400))  # the rendezvous host first, then in order
    assert store_hosts(named, elastic=True) == (GPU2, GPU1, GPU3)
    assert successor_names(named, elastic=True) == ("gpu1", "gpu3")
    assert successor_names(named, elastic=False) == ()
    local = Selection((node("box", "local"),), Rendezvous(None, 29400))  # standalone: torchrun opens no port
    assert store_hosts(local, elastic=True) == ()


def test_a_busy_successor_port_fails_naming_host_and_port() -> None:
    successors = (RendezvousFacts("gpu2", "10.9.0.2", 29400, "in use (Address already in use)"),
                  RendezvousFacts("gpu3", "10.9.0.3", 29400, "free"))
    assert successor_findings(successors) == [Finding(Level.FAIL, "gpu2", (
        "rendezvous port 29400 cannot be opened on gpu2 (10.9.0.2): in use (Address already in use); this elastic "
        "run's store moves there if its rendezvous host is lost, and that failover would fail (another run's store? "
        "`fab status`; or give this inventory another `rendezvous.port`)"))]
    assert successor_findings(()) == []  # not elastic


@pytest.mark.parametrize(("text", "expected"), [
    ('{"boot": "b", "rdzv": "free"}', "free"),
    ('{"boot": "b", "rdzv": "in use"}', "in use"),
    ('{"rdzv": "unavailable"}', "unavailable"),
    ('{"boot": "b"}', None),  # an older probe, or the port not asked
    ('{"rdzv": "FREE"}', None),
    ('{"rdzv": "free "}', None),
    ('{"rdzv": true}', None),
    ('["free"]', None),
    ('Welcome to gpu1\n{"rdzv": "free"}', None),  # login noise: not one JSON object
    ("[" * 100_000, None),  # json.loads raises RecursionError
    ('{"rdzv": "free", "x": "' + "a" * 200_000 + '"}', None),
])
def test_a_stamp_vouches_for_the_port_only_in_so_many_words(text: str, expected: str | None) -> None:
    assert stamp_port(text) == expected
    assert expected is None or expected in STAMP_STATES


# --- the host probes, real processes on loopback ---

def listener(rdzv_port: int, *mode: str):  # type: ignore[no-untyped-def]
    return probe_listener(rdzv_port, 30, *mode)


def test_a_successors_listener_binds_the_port_and_lets_it_go_at_once() -> None:
    """While the probe still runs, whatever opens the port next (a run's failover) can: it is free."""
    port = free_port()
    with listener(port, "bind") as answer:
        assert answer["rendezvous"] == "free"
        with socket.create_server((TRAINING, port)) as store:  # a TCPStore opening it now
            with socket.create_connection((TRAINING, port), timeout=3):
                assert store.accept()[0] is not None


def test_a_successors_port_held_on_any_address_is_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:  # torch's store binds every address
        with listener(squatter.getsockname()[1], "bind") as answer:
            assert answer["rendezvous"] == "in use (Address already in use)"


def stamp(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", STAMP.read_text(), *args], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def test_the_stamp_says_whether_the_port_is_free_now() -> None:
    port = free_port()
    assert "rdzv" not in stamp()  # a host that hosts no store: not asked
    assert stamp("127.0.0.1", str(port))["rdzv"] == "free"
    with socket.create_server((TRAINING, port)):  # another run's store, on any address
        busy = stamp("127.0.0.1", str(port))
    assert busy["rdzv"] == "in use"
    assert {k: v for k, v in busy.items() if k != "rdzv"} == {k: v for k, v in stamp().items() if k != "rdzv"}
    with socket.socket() as probe:  # bound, not listening (a successor's check): no store, and free for one
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((TRAINING, port))
        assert stamp("127.0.0.1", str(port))["rdzv"] == "free"


# --- the controller's fan-out ---

def able(h: Host) -> HostFacts:
    return HostFacts(h.name, h.address, "lan", True, fingerprint=Fingerprint("3.11.9", "2.5.0"), mtu=None)


def link_host(answers: dict[str, str], asked: dict[str, list[list[str]]], name: str):
    """A host whose listener answers its rendezvous state from `answers`, and whose link probe
    finds every target open; `asked` records each probe's arguments."""
    def answer(argv: Sequence[str]) -> str:
        asked.setdefault(name, []).append(list(argv[3:]))
        if argv[3] == "listen":
            return json.dumps({"port": 41000, "rendezvous": answers[name], "lifetime": 60}) + "\n"
        targets = json.loads(argv[4])["targets"]
        return json.dumps([{"state": "open", "connect_ms": 1.0, "detail": ""} for _ in targets]) + "\n"
    return answer


def test_the_pre_flight_asks_every_successor_to_bind_the_rendezvous_port() -> None:
    answers = {"gpu1": "listening", "gpu2": "in use (Address already in use)", "gpu3": "free"}
    asked: dict[str, list[list[str]]] = {}
    sessions = {h.name: FakeSession(link_host(answers, asked, h.name), the_host=h) for h in THREE.hosts}
    facts = tuple(able(h) for h in THREE.hosts)
    probed = check_probes.probe_network(THREE.hosts, GPU1, 29400, sessions, facts, 0.0, sys.executable,
                                        successor_names(THREE, elastic=True))
    lifetime = str(60 + 0.0)
    assert {name: calls[0] for name, calls in asked.items()} == {
        "gpu1": ["listen", "10.9.0.1", "29400", lifetime],  # the head serves it: the others connect there
        "gpu2": ["listen", "10.9.0.2", "29400", lifetime, "bind"],
        "gpu3": ["listen", "10.9.0.3", "29400", lifetime, "bind"]}
    assert probed.rendezvous == RendezvousFacts("gpu1", "10.9.0.1", 29400, "listening")
    assert probed.successors == (RendezvousFacts("gpu2", "10.9.0.2", 29400, "in use (Address already in use)"),
                                 RendezvousFacts("gpu3", "10.9.0.3", 29400, "free"))
    # Only the head's is a target: nothing connects to a successor's port, which nothing holds.
    assert [(k.source, k.target) for k in probed.links if k.rendezvous] == [("gpu1", "gpu1"), ("gpu2", "gpu1"),
                                                                            ("gpu3", "gpu1")]
    asked.clear()  # a plain run: the successors' listeners are not asked for the port
    plain = check_probes.probe_network(THREE.hosts, GPU1, 29400, sessions, facts, 0.0, sys.executable)
    assert {name: calls[0][2] for name, calls in asked.items()} == {"gpu1": "29400", "gpu2": "-", "gpu3": "-"}
    assert (plain.rendezvous, plain.successors) == (probed.rendezvous, ())


def stamp_host(states: dict[str, str], asked: dict[str, list[str]], name: str):
    def answer(argv: Sequence[str]) -> str:
        asked[name] = list(argv[3:])
        return json.dumps({"boot": "b", **({"rdzv": states[name]} if argv[3:] else {})}) + "\n"
    return answer


def test_a_busy_port_on_a_store_host_is_no_reuse_of_a_passed_pre_flight(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Terminal 1 passes; run A's store takes the port; terminal 2's pre-flight runs in full, not reused."""
    states, asked = {"gpu1": "free", "gpu2": "free", "gpu3": "free"}, {}
    sessions = {h.name: FakeSession(stamp_host(states, asked, h.name), the_host=h) for h in THREE.hosts}
    checked: list[bool] = []
    monkeypatch.setattr(check, "_check_before_run", lambda sel, ses, r, elastic: checked.append(elastic) or ())
    cache = tmp_path / "preflight.json"
    assert [check.preflight(THREE, sessions, Renderer(), cache) for _ in range(2)] == [False, True]
    assert asked == {"gpu1": ["10.9.0.1", "29400"], "gpu2": [], "gpu3": []}  # a plain run's store: the head's
    states["gpu1"] = "in use"
    assert check.preflight(THREE, sessions, Renderer(), cache) is False  # checked in full: it FAILs there
    states["gpu1"], states["gpu3"] = "free", "in use"
    assert check.preflight(THREE, sessions, Renderer(), cache) is True  # a plain run never uses gpu3's port
    # An elastic run's successors host the store after a failover: their stamps are asked too.
    assert check.preflight(THREE, sessions, Renderer(), cache, elastic=True) is False
    assert asked == {"gpu1": ["10.9.0.1", "29400"], "gpu2": ["10.9.0.2", "29400"], "gpu3": ["10.9.0.3", "29400"]}
    states["gpu3"] = "free"
    # A plain run's pass stands for no elastic one (the successors were not checked), and back.
    assert [check.preflight(THREE, sessions, Renderer(), cache, elastic=True) for _ in range(2)] == [False, True]
    assert checked == [False, False, True, True]


class ThisMachine:
    """`host` as this machine: the probe's argv run here (the real deploy/host/stamp.py)."""

    def __init__(self, the_host: Host) -> None:
        self.host = the_host

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr)


def test_a_run_holding_the_port_here_changes_the_real_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    here = dataclasses.replace(node("box", "127.0.0.1"), python=sys.executable)
    selection = Selection((here,), Rendezvous(None, port))
    sessions = {"box": ThisMachine(here)}
    monkeypatch.setattr(check, "_check_before_run", lambda *args: ())
    cache = tmp_path / "preflight.json"
    assert [check.preflight(selection, sessions, Renderer(), cache) for _ in range(2)] == [False, True]
    stored = load_pass(cache)
    with socket.create_server(("127.0.0.1", port)):  # run A's store
        assert host_stamps(selection.hosts, sessions, sys.executable, port, (here,)) is None
        assert check.preflight(selection, sessions, Renderer(), cache) is False
    assert load_pass(cache) == stored  # nothing stored over a busy port
    stamps = host_stamps(selection.hosts, sessions, sys.executable, port, (here,))
    assert stamps is not None and json.loads(stamps["box"])["rdzv"] == "free"


@pytest.mark.parametrize("elastic", [True, False])
def test_fab_train_asks_the_preflight_for_its_successors_ports_when_elastic(monkeypatch: pytest.MonkeyPatch,
                                                                           elastic: bool) -> None:
    """train's own call: an elastic run's pre-flight checks every successor's port (the check
    itself is tested above); the route query beside it stands in (it needs hosts)."""
    from meshrun.deploy.commands import train
    asked: list = []
    monkeypatch.setattr(train, "preflight", lambda selection, sessions, renderer, elastic=False, root=None: asked.append(elastic))
    monkeypatch.setattr(train, "training_interfaces", lambda hosts, head, sessions: {"h1": "eth0"})
    assert train._checked_routes(False, THREE, {}, Renderer(), elastic) == {"h1": "eth0"}
    assert asked == [elastic]
