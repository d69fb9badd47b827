"""A host's answer of the wrong shape is a one-line MeshrunError naming the host and what was wrong
(deploy/run/answers.py, deploy/check/answers.py), never a TypeError, ValueError, KeyError or
AttributeError in the controller, which the user would see as "internal error". Each crafted answer
goes through the real controller function over a fake session (tests/fakesession.py); messages are
compared whole. The answers that are data rather than a failure (a route, an MTU) degrade to
"unknown". This file: the probes of check-network and firewall; tests/test_hostile_answers.py: the
run's answers."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from meshrun.deploy.check.verdicts import Fingerprint, LinkResult, PortState
from meshrun.deploy.commands import firewall
from meshrun.deploy.edges import check_probes, exposure, host_queries
from meshrun.deploy.inventory.model import Network
from tests.fakesession import DEEP, FakeSession, failure, host

EXPOSURE = "host 'h1': the exposure probe gave an unexpected answer: "


@pytest.mark.parametrize("answer,rdzv,message", [
    ('{"ports": [1]}', None, EXPOSURE + "ports is [1]; expected an object"),
    ('{"ports": {"ephemeral": "x"}}', None, EXPOSURE + "ports.ephemeral is 'x'; expected a port number (1-65535)"),
    ('{"ports": {}}', None, EXPOSURE + "ports.ephemeral is missing; expected a port number (1-65535)"),
    ('{"ports": {"ephemeral": 0}}', None, EXPOSURE + "ports.ephemeral is 0; expected a port number (1-65535)"),
    ('{"ports": {"ephemeral": 65536}}', None, EXPOSURE + "ports.ephemeral is 65536; expected a port number (1-65535)"),
    ('{"ports": {"ephemeral": true}}', None, EXPOSURE + "ports.ephemeral is True; expected a port number (1-65535)"),
    ('{"ports": {"ephemeral": 1e999}}', None, EXPOSURE + "ports.ephemeral is inf; expected a port number (1-65535)"),
    ('{"ports": {"ephemeral": 4000, "rendezvous": 22}}', 29400,
     EXPOSURE + "ports.rendezvous is 22; expected null or 29400"),
    ('{"ports": {"ephemeral": 4000, "rendezvous": "29400"}}', None,
     EXPOSURE + "ports.rendezvous is '29400'; expected null"),
    (DEEP, None, "host 'h1': the exposure probe did not start"),
    ('{"ports": {"ephemeral": 4000}, "addresses": {"eth0": "8.8.8.8"}}', None,
     EXPOSURE + "addresses is {'eth0': '8.8.8.8'}; expected a list"),
    ('{"ports": {"ephemeral": 4000}, "addresses": [["eth0"]]}', None,
     EXPOSURE + "addresses[0] is ['eth0']; expected an [interface, address] pair"),
    ('{"ports": {"ephemeral": 4000}, "addresses": [["eth0", 8]]}', None,
     EXPOSURE + "addresses[0][1] is 8; expected text"),
])
def test_exposure_probe_answers(answer: str, rdzv: int | None, message: str) -> None:
    the_host = host(Network.ZEROTIER, "127.0.0.1")
    session = FakeSession(answer + "\n", the_host=the_host)
    assert failure(lambda: exposure._probe_host(session, the_host, rdzv, "/venv/bin/python")) == message
    assert session.streams[0].closed


def test_a_sound_exposure_answer_is_probed() -> None:
    the_host = host(Network.ZEROTIER, "127.0.0.1")
    with socket.create_server(("127.0.0.1", 0)) as bait:
        port = bait.getsockname()[1]
        session = FakeSession(f'{{"ports": {{"ephemeral": {port}, "rendezvous": null}}}}\n', the_host=the_host)
        probe = exposure._probe_host(session, the_host, None, "/venv/bin/python")
    assert [(r.target.address, r.target.port, r.state) for r in probe.results] == [("127.0.0.1", port, "open")]
    assert probe.busy == ()


def test_a_bait_that_could_not_take_the_rendezvous_port_is_said() -> None:
    the_host = host(Network.ZEROTIER, "127.0.0.1")
    with socket.create_server(("127.0.0.1", 0)) as bait:
        port = bait.getsockname()[1]
        session = FakeSession(f'{{"ports": {{"ephemeral": {port}, "rendezvous": null}}, "addresses": [["lo", '
                              '"127.0.0.1"], ["eth0", "10.0.0.5"]]}\n', the_host=the_host)
        probe = exposure._probe_host(session, the_host, 29400, "/venv/bin/python")
    assert [(r.target.address, r.target.port, r.state) for r in probe.results] == [("127.0.0.1", port, "open")]
    assert probe.busy == (("h1", 29400),)


FIREWALL = "host 'h1': the firewall script gave an unexpected answer: "


@pytest.mark.parametrize("answer,message", [
    ("[1]", FIREWALL + "the answer is [1]; expected a JSON object"),
    ('{"error": null}', FIREWALL + "results is missing; expected a list"),
    ('{"error": 5}', FIREWALL + "error is 5; expected text or null"),
    ('{"error": null, "results": [1]}', FIREWALL + "results[0] is 1; expected an object"),
    ('{"error": null, "results": {"argv": 1}}', FIREWALL + "results is {'argv': 1}; expected a list"),
    ('{"error": null, "results": [{"argv": "ls", "stdout": ""}]}',
     FIREWALL + "results[0].argv is 'ls'; expected a list of text"),
    ('{"error": null, "results": [{"argv": ["ls"]}]}', FIREWALL + "results[0].stdout is missing; expected text"),
    ('{"error": null, "results": [], "notes": "abc"}', FIREWALL + "notes is 'abc'; expected a list of text"),
    ('{"error": "iptables gone\\u001b[2J"}', "host 'h1': iptables gone\\x1b[2J"),
    (DEEP, "host 'h1': the firewall script failed: exit status 0"),
])
def test_firewall_script_answers(answer: str, message: str) -> None:
    assert failure(lambda: firewall._on_host(FakeSession(answer), host(), {})) == message


def test_a_sound_firewall_answer() -> None:
    answer = ('{"results": [{"argv": ["iptables", "-S"], "rc": 0, "stdout": "-N MESHRUN\\n", "stderr": ""}], '
              '"error": null, "notes": ["ip6tables not found"]}')
    found = firewall._on_host(FakeSession(answer), host(), {})
    assert (found.ran, found.output, found.notes) == ((("iptables", "-S"),), "-N MESHRUN\n", ("ip6tables not found",))


LISTENER = "host 'h1': the link listener gave an unexpected answer: "


@pytest.mark.parametrize("answer,message", [
    ('{"port": 5}', LISTENER + "rendezvous is missing; expected text"),
    ('{"port": "5", "rendezvous": "listening"}', LISTENER + "port is '5'; expected a port number (1-65535)"),
    ('{"port": null, "rendezvous": "listening"}', LISTENER + "port is None; expected a port number (1-65535)"),
    ('{"port": -1, "rendezvous": "listening"}', LISTENER + "port is -1; expected a port number (1-65535)"),
    ('{"port": 65536, "rendezvous": "listening"}', LISTENER + "port is 65536; expected a port number (1-65535)"),
    ('{"port": 1e3, "rendezvous": "listening"}', LISTENER + "port is 1000.0; expected a port number (1-65535)"),
    ('{"port": ' + "9" * 30 + ', "rendezvous": "listening"}',
     LISTENER + "port is 999999999999999999999999999999; expected a port number (1-65535)"),
    ('{"port": 5, "rendezvous": ["x"]}', LISTENER + "rendezvous is ['x']; expected text"),
    ('{"error": 5}', "host 'h1': the link probe did not start ('{\"error\": 5}')"),
    ("[1]", "host 'h1': the link probe did not start ('[1]')"),
    ("\x1b[2Jpwned", "host 'h1': the link probe did not start ('\\x1b[2Jpwned')"),
])
def test_link_listener_answers(answer: str, message: str) -> None:
    session = FakeSession(answer + "\n")
    assert failure(lambda: check_probes.start_listener(session, host(), None, 60, "/venv/bin/python")) == message
    assert session.streams[0].abandoned


def test_a_sound_listener_answer() -> None:
    listener = check_probes.start_listener(FakeSession('{"port": 41234, "rendezvous": "listening", "lifetime": 60}\n'),
                                           host(), None, 60, "/venv/bin/python")
    assert (listener.port, listener.rendezvous) == (41234, "listening")


LINKS = "host 'h1': the link probe gave an unexpected answer: "
TARGETS = [{"name": "h2", "address": "10.0.0.2", "port": 41234}]
STATES = "one of open, refused, timeout, unreachable, error"


@pytest.mark.parametrize("answer,message", [
    ('[{"state": "pwned"}]', LINKS + f"[0].state is 'pwned'; expected {STATES}"),
    ('[{"state": "skipped"}]', LINKS + f"[0].state is 'skipped'; expected {STATES}"),
    ("[{}]", LINKS + f"[0].state is missing; expected {STATES}"),
    ('{"state": "open"}', LINKS + "the answer is {'state': 'open'}; expected a list"),
    ("[1]", LINKS + "[0] is 1; expected an object"),
    ("[]", LINKS + "0 result(s) for 1 target(s)"),
    ('[{"state": "open"}, {"state": "open"}]', LINKS + "2 result(s) for 1 target(s)"),
    ('[{"state": "open", "connect_ms": "fast"}]', LINKS + "[0].connect_ms is 'fast'; expected a number >= 0 or null"),
    ('[{"state": "open", "connect_ms": -1}]', LINKS + "[0].connect_ms is -1; expected a number >= 0 or null"),
    ('[{"state": "open", "mbit_s": "fast"}]', LINKS + "[0].mbit_s is 'fast'; expected a number >= 0 or null"),
    ('[{"state": "open", "detail": 5}]', LINKS + "[0].detail is 5; expected text"),
    ('[{"state": "open", "df_ok": "yes"}]', LINKS + "[0].df_ok is 'yes'; expected true, false or null"),
])
def test_link_probe_answers(answer: str, message: str) -> None:
    assert failure(lambda: check_probes.probe_links(FakeSession(answer), host(), TARGETS, 1372, 0.0,
                                                    "/venv/bin/python")) == message


def test_a_rate_no_link_gives_voids_that_link_only() -> None:
    """NaN, infinite, negative: the figure of that one link is gone, with why; the host's answer
    stands (a peer answering `inf` to its transfer must not make the whole host look broken)."""
    answer = '[{"state": "open", "connect_ms": 0.5, "detail": "", "df_ok": true, "mbit_s": NaN}]'
    assert check_probes.probe_links(FakeSession(answer), host(), TARGETS, 1372, 0.0, "/venv/bin/python") == (
        LinkResult("h1", "h2", "10.0.0.2", 41234, PortState.OPEN, False, 0.5,
                   "the probe reported nan Mbit/s, no usable rate", 1372, True, None),)


def test_a_sound_link_answer() -> None:
    answer = '[{"state": "open", "connect_ms": 0.5, "detail": "", "df_ok": true, "mbit_s": 940.5}]'
    assert check_probes.probe_links(FakeSession(answer), host(), TARGETS, 1372, 0.0, "/venv/bin/python") == (
        LinkResult("h1", "h2", "10.0.0.2", 41234, PortState.OPEN, False, 0.5, "", 1372, True, 940.5),)


def test_a_host_whose_transfers_fail_as_a_whole_gives_its_links_the_reason() -> None:
    """The bandwidth phase (--bandwidth): h1's answer is sound, h2's unreadable (a probe killed, or a
    hostile host): h1's rates stand, and every open link of h2 carries why it has none."""
    h1, h2 = host(), dataclasses.replace(host(), name="h2", address="10.0.0.2")
    found = {"h1": (LinkResult("h1", "h2", "10.0.0.2", 41234, PortState.OPEN, connect_ms=0.5),
                    LinkResult("h1", "h3", "10.0.0.3", 41235, PortState.OPEN, connect_ms=0.5)),
             "h2": (LinkResult("h2", "h1", "10.147.17.5", 41236, PortState.OPEN, connect_ms=0.5),
                    LinkResult("h2", "h3", "10.0.0.3", 41235, PortState.REFUSED, detail="connection refused"))}
    sessions = {"h1": FakeSession('[{"state": "open", "mbit_s": 940.5, "detail": ""}, '
                                  '{"state": "error", "mbit_s": null, "detail": "Connection reset by peer"}]'),
                "h2": FakeSession("Killed\n", rc=137)}
    assert check_probes.measure_bandwidth((h1, h2), found, sessions, 1.0, "/venv/bin/python") == {
        ("h1", "h2"): (940.5, ""), ("h1", "h3"): (None, "Connection reset by peer"),
        ("h2", "h1"): (None, "the transfers from h2 failed: host 'h2': the link probe failed (exit status 137, no answer)")}


FACTS = "host 'h1': the facts probe gave an unexpected answer: "


@pytest.mark.parametrize("answer,message", [
    ('{"python": "3.11.7", "tools": [1]}', FACTS + "tools is [1]; expected an object"),
    ('{"python": "3.11.7", "tools": {"nvidia-smi": 5}}', FACTS + "tools.nvidia-smi is 5; expected text or null"),
    ('{"python": "3.11.7", "disk_free": "lots"}', FACTS + "disk_free is 'lots'; expected a number of bytes or null"),
    ('{"python": "3.11.7", "disk_free": -5}', FACTS + "disk_free is -5; expected a number of bytes or null"),
    ('{"python": 3}', FACTS + "python is 3; expected text or null"),
    ('{"python": "3.11.7", "torch": ["2.4"]}', FACTS + "torch is ['2.4']; expected text or null"),
    ('{"python": "3.11.7", "error": {"x": 1}}', FACTS + "error is {'x': 1}; expected text or null"),
])
def test_facts_probe_answers(answer: str, message: str) -> None:
    assert failure(lambda: check_probes.host_facts(FakeSession(answer), host(), None, "/venv/bin/python")) == message


def test_a_sound_facts_answer() -> None:
    answer = ('{"python": "3.11.7", "torch": "2.4.1", "cuda": null, "nccl": null, "error": null, '
              '"disk_free": 10737418240, "meshrun": null, "tools": {"nvidia-smi": null, "ping": "/bin/ping"}}')
    facts = check_probes.host_facts(FakeSession(answer), host(), None, "/venv/bin/python")
    assert (facts.fingerprint, facts.disk_free_gib, facts.gpu_note) == (
        Fingerprint("3.11.7", "2.4.1"), 10.0, "nvidia-smi not found: CPU only")
    assert not facts.python_unset
    unset = check_probes.host_facts(FakeSession(answer), dataclasses.replace(host(), python=None), None, "/x/python")
    local = dataclasses.replace(host(), python=None, address="local")
    assert (unset.python_unset, check_probes.host_facts(FakeSession(answer), local, None, "/x/python").python_unset) \
        == (True, False)


ROUTE = ("host 'h1': no route to 10.0.0.2 (ip route get gave no interface: {}); check the host's network and its "
         "route to the peer")


@pytest.mark.parametrize("answer,shown", [
    ('{"dev": "eth0"}', "'{\"dev\": \"eth0\"}'"),
    ("[1]", "'[1]'"),
    ('"eth0"', "'\"eth0\"'"),
    ('[{"dev": 5}]', "'[{\"dev\": 5}]'"),
    ('[{"dev": "eth0 x"}]', "'[{\"dev\": \"eth0 x\"}]'"),
    ('[{"dev": "eth0\\u001b"}]', "'[{\"dev\": \"eth0\\\\u001b\"}]'"),
])
def test_route_answers(answer: str, shown: str) -> None:
    assert failure(lambda: host_queries.route_interface(FakeSession(answer), "10.0.0.2")) == ROUTE.format(shown)


@pytest.mark.parametrize("link", ['[{"mtu": "big"}]', '[{"mtu": 10}]', '{"mtu": 1500}', DEEP, '[{"mtu": true}]'])
def test_an_unreadable_mtu_is_unknown(link: str) -> None:
    answers = lambda argv: '[{"dev": "eth0"}]' if "route" in argv else link  # noqa: E731
    assert host_queries.route_interface(FakeSession(answers), "10.0.0.2") == host_queries.Interface("eth0", None)


def test_gpu_lines_with_unicode_digits_are_skipped() -> None:
    assert host_queries.parse_gpus("0, H200, \u00b2, 5, GPU-1\n1, H200, 10, 20, GPU-2\n") == ((1, "H200", 10, 20, "GPU-2"),)
