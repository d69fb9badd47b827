"""A host's answer of the wrong shape is a one-line MeshrunError naming the host and what was wrong
(deploy/run/answers.py), never a TypeError, ValueError, KeyError or AttributeError in the
controller, which the user would see as "internal error". Each crafted answer goes through the
real controller function over a fake session (tests/fakesession.py); messages are compared whole.
result.json, which is data rather than a failure, degrades to "unknown". This file: the run's
answers (stop, detached start, setup, result, the `--comm` record, the provenance's config record,
ZeroTier and WireGuard output);
tests/test_hostile_probe_answers.py: the probes of check-network and firewall."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrun.deploy.check import wireguard, zerotier
from meshrun.deploy.commands import setup, trainend
from meshrun.deploy.edges import agents, comm, detachedstart, provenance
from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, plan_launch
from meshrun.deploy.run.requirements import Requirements
from meshrun.deploy.run.summary import build_summary
from tests.fakesession import DEEP, FakeSession, failure, host

def plan() -> LaunchPlan:
    return plan_launch(Selection((host(),), Rendezvous("h1", 29400)), LaunchOptions("r1"), {}, "/venv/bin/python")


STOP = "host 'h1': the agent's stop gave an unexpected answer: "
STOP_CASES = [
    ("[1]", STOP + "the answer is [1]; expected a JSON object"),
    ('{"remaining": "abc"}', STOP + "remaining is 'abc'; expected a list of process ids"),
    ('{"remaining": {"1": 2}}', STOP + "remaining is {'1': 2}; expected a list of process ids"),
    ('{"remaining": [1, "x"]}', STOP + "remaining is [1, 'x']; expected a list of process ids"),
    ('{"remaining": [-5]}', STOP + "remaining is [-5]; expected a list of process ids"),
    ('{"remaining": [true]}', STOP + "remaining is [True]; expected a list of process ids"),
    ("{}", STOP + "remaining is missing; expected a list of process ids"),
]


@pytest.mark.parametrize("answer,message", STOP_CASES)
def test_launcher_stop_answers(answer: str, message: str, tmp_path: Path) -> None:
    runner = JobRunner(plan(), {"h1": FakeSession(answer)}, lambda _h, _l: None, tmp_path, "/venv/bin/python")
    assert failure(lambda: runner._stop_host(runner.hosts[0])) == message


@pytest.mark.parametrize("answer,message", STOP_CASES)
def test_fab_stop_answers(answer: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "run_hosts", lambda _record, _root: ((host(),), SimpleNamespace(known_hosts=None), {}))
    monkeypatch.setattr(agents, "connect", lambda *_args: FakeSession(answer))
    results = agents.stop_hosts(SimpleNamespace(run_id="r1"), Path("."), ("h1",))
    assert str(results.failed.get("h1")) == message


def test_a_sound_stop_answer(tmp_path: Path) -> None:
    runner = JobRunner(plan(), {"h1": FakeSession('{"remaining": [4242]}')}, lambda _h, _l: None, tmp_path, "/p")
    assert runner._stop_host(runner.hosts[0]) == (4242,)


DETACHED = "host 'h1': the agent's detached start gave an unexpected answer: "
STOP_HINT = "; stop what did start with: fab stop --run r1"


@pytest.mark.parametrize("answer,message", [
    ('["error"]', DETACHED + "the answer is ['error']; expected a JSON object" + STOP_HINT),
    ('"error"', DETACHED + "the answer is 'error'; expected a JSON object" + STOP_HINT),
    ("[1]", DETACHED + "the answer is [1]; expected a JSON object" + STOP_HINT),
    ('{"error": "no\\u001b[2J"}', "host 'h1': detached start failed: no\\x1b[2J" + STOP_HINT),
])
def test_detached_start_answers(answer: str, message: str) -> None:
    assert failure(lambda: detachedstart.start_detached(plan(), {"h1": FakeSession(answer + "\n")})) == message


REQUEST = setup.SetupRequest("/usr/bin/python3", None, Path("meshrun-0.1.0-py3-none-any.whl"),
                             Identity("0.1.0", "0123456789ab"), Requirements())
SETUP = "host 'h1': the setup script gave an unexpected answer: "


@pytest.mark.parametrize("answer,message", [
    ('{"actions": 5, "python": "/v/bin/python", "torch": "2.4"}', SETUP + "actions is 5; expected a list of text"),
    ('{"python": "/v/bin/python"}', SETUP + "actions is missing; expected a list of text"),
    ('{"actions": [], "python": 5, "torch": null}', SETUP + "python is 5; expected text"),
    ('{"actions": [], "python": "", "torch": null}', SETUP + "python is ''; expected the venv's interpreter"),
    ('{"actions": [], "python": "/v/bin/python", "torch": 2}', SETUP + "torch is 2; expected text or null"),
    ('{"error": "pip\\u001b[2J"}', "host 'h1': setup failed: pip\\x1b[2J; is `/usr/bin/python3` a Python >= 3.10 "
                                   "with venv? (--base PYTHON)"),
    ('{"error": "/usr/bin/python3 -m venv failed: ensurepip is not available; on Debian or Ubuntu install python3-venv"}',
     "host 'h1': setup failed: /usr/bin/python3 -m venv failed: ensurepip is not available; on Debian or Ubuntu install "
     "python3-venv"),
    ('{"error": "pip could not install torch: No matching distribution"}',
     "host 'h1': setup failed: pip could not install torch: No matching distribution; check the project's requirements "
     "and that the host reaches its package index"),
])
def test_setup_script_answers(answer: str, message: str) -> None:
    assert failure(lambda: setup._run_setup(host(), FakeSession(answer), REQUEST, False)) == message


def test_a_sound_setup_answer_and_an_unplain_identity() -> None:
    answer = '{"actions": ["created the venv"], "python": "/v/bin/python", "torch": "2.4.1"}'
    assert setup._run_setup(host(), FakeSession(answer), REQUEST, False) == setup.SetupResult(
        "h1", ("created the venv",), "/v/bin/python", "2.4.1")
    crafted = '{"meshrun": {"version": "\\u001b[2J", "build": "x"}}'
    assert setup.installed_identity(FakeSession(crafted), "/v/bin/python") == Identity("unreadable", "unknown")


@pytest.mark.parametrize("answer,fields", [
    ("[1]", (1, 0, 0, {}, None)),
    (DEEP, (1, 0, 0, {}, None)),
    ('{"world_size": "x", "restarts": null, "epochs_completed": 2.5, "metrics": [1], "best_test_acc": "high"}',
     (1, 0, 0, {}, None)),
    ('{"metrics": {"loss": "low", "acc": 0.9, "x": Infinity}, "best_test_acc": NaN}', (1, 0, 0, {"acc": 0.9}, None)),
    ('{"world_size": 2, "restarts": 1, "epochs_completed": 3, "metrics": {"acc": 0.91}, "best_test_acc": 0.93}',
     (2, 1, 3, {"acc": 0.91}, 0.93)),
])
def test_result_json_of_any_shape_still_gives_a_summary(answer: str, fields: tuple) -> None:
    the_plan = plan()
    outcome = JobOutcome("r1", JobStatus.SUCCEEDED, 0.0, 1.0, ())
    summary = build_summary(the_plan, outcome, trainend.read_result({"h1": FakeSession(answer)}, the_plan))
    assert (summary.world_size, summary.restarts, summary.epochs_completed, summary.metrics,
            summary.best_test_acc) == fields


def test_zerotier_and_wireguard_output_of_any_shape() -> None:
    networks, peers = "[]", "[]"
    assert zerotier.parse_state(DEEP, networks, peers) == zerotier.ZeroTierState(
        error="`zerotier-cli -j info` printed no JSON: " + repr("[" * 120))
    assert zerotier.parse_state('{"address": ["x"], "online": true}', networks, peers) == zerotier.ZeroTierState(
        error="`zerotier-cli -j info` gives an address or version that is not text")
    assert wireguard.parse_handshakes("wg0\tkey\t\u00b2\nwg0\tkey2\t90\n", 100) == (
        wireguard.WgPeer("wg0", "key2", 10),)


ZT_INFO = '{"address": "a1b2c3d4e5", "online": true}'
ZT = "`zerotier-cli -j "


@pytest.mark.parametrize("info,networks,peers,error", [
    ('{"address": "a1", "online": "false"}', "[]", "[]",
     ZT + "info` gives an online or tcpFallbackActive that is not true or false"),
    ('{"address": "a1", "tcpFallbackActive": 1}', "[]", "[]",
     ZT + "info` gives an online or tcpFallbackActive that is not true or false"),
    (ZT_INFO, '[{"nwid": "n1", "assignedAddresses": 5}]', "[]",
     ZT + "listnetworks` gives a network whose assignedAddresses is not a list of text"),
    (ZT_INFO, '[{"nwid": "n1", "assignedAddresses": "10.0.0.1/24"}]', "[]",
     ZT + "listnetworks` gives a network whose assignedAddresses is not a list of text"),
    (ZT_INFO, '[{"nwid": "n1", "assignedAddresses": [["10.0.0.1/24"]]}]', "[]",
     ZT + "listnetworks` gives a network whose assignedAddresses is not a list of text"),
    (ZT_INFO, '[{"nwid": ["n1"]}]', "[]", ZT + "listnetworks` gives a network whose nwid is not text"),
    (ZT_INFO, '[{"id": 7}]', "[]", ZT + "listnetworks` gives a network whose id is not text"),
    (ZT_INFO, '[{"nwid": "n1", "status": {"OK": 1}}]', "[]",
     ZT + "listnetworks` gives a network whose status is not text"),
    (ZT_INFO, '[{"nwid": "n1", "portDeviceName": 3}]', "[]",
     ZT + "listnetworks` gives a network whose portDeviceName is not text"),
    (ZT_INFO, "[]", '[{"address": 5}]', ZT + "peers` gives a peer whose address is not text"),
    (ZT_INFO, "[]", '[{"address": "b2", "role": ["LEAF"]}]', ZT + "peers` gives a peer whose role is not text"),
])
def test_zerotier_fields_of_the_wrong_type_are_an_error_line(info: str, networks: str, peers: str, error: str) -> None:
    assert zerotier.parse_state(info, networks, peers) == zerotier.ZeroTierState(error=error)


def test_zerotier_informational_fields_of_the_wrong_type_degrade() -> None:
    networks = '[1, {"nwid": "n1", "mtu": "big", "assignedAddresses": null}, {"id": "n2", "mtu": true}]'
    peers = '["x", {"address": "b2", "latency": "fast", "paths": 5}]'
    assert zerotier.parse_state(ZT_INFO, networks, peers) == zerotier.ZeroTierState(
        "a1b2c3d4e5", zerotier.NodeState.ONLINE, None,
        (zerotier.ZtNetwork("n1", "", "?", None, None, ()), zerotier.ZtNetwork("n2", "", "?", None, None, ())),
        (zerotier.ZtPeer("b2", "?", zerotier.Link.RELAY, None),))


def test_a_comm_record_of_a_number_no_float_holds_is_skipped() -> None:
    big = '{"kind": "comm", "comm_s": ' + "9" * 400 + "}"
    sound = '{"kind": "comm", "comm_s": 0.02}'
    assert comm.read_comm_record({"h1": FakeSession(sound + "\n" + big)}, plan()) == {"kind": "comm", "comm_s": 0.02}
    assert comm.read_comm_record({"h1": FakeSession(big)}, plan()) is None
    saved = {"hook": "none", "recommended": "none", "reason": "r", "bandwidth_bytes_s": 1e6, "nodes": 2,
             "floors": [{"hook": "none", "floor_s": 1e-300}]}
    assert comm.beside_floor(saved, 1e300) == {"hook": "none", "recommended": "none", "reason": "r",
                                               "bandwidth_mbit_s": 8.0, "nodes": 2, "rtt_ms": 0.0,
                                               "floor_s": 1e-300, "measured_s": 1e300, "ratio": None}


def test_a_config_record_nested_past_the_recursion_limit_is_left_out() -> None:
    deep = '{"kind": "config", "config": ' + '{"a": ' * 600 + "1" + "}" * 600 + "}"
    sound = '{"kind": "config", "config": {"epochs": 2}}'
    assert provenance.at_end({"h1": FakeSession(deep)}, ["h1"], "r1", None) == {
        "links": None, "trainer_config": None, "checkpoints": None}
    assert provenance.at_end({"h1": FakeSession(sound + "\n" + deep)}, ["h1"], "r1", None)["trainer_config"] == {
        "epochs": 2}
