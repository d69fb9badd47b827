"""Notifications (issue 23, item 2): the receivers and event bodies by exact equality, and the sender
against a real HTTP server on a thread. The cluster run (a host killed, events in order) is
tests/test_elastic.py::test_a."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.host.notify import AgentNotices, Sender
from meshrun.deploy.run import notify
from meshrun.deploy.run.membership import Change, MembershipEvent
from tests.test_peer_watcher import listener
from tests.webhook import Receiver

REPO = Path(__file__).resolve().parents[1]


def test_receivers_are_checked_and_never_quoted() -> None:
    assert notify.receivers(["http://a/x", "https://b:8443/y?token=1", "http://a/x"], ["https://c/z"]) == (
        "http://a/x", "https://b:8443/y?token=1", "https://c/z")
    for bad, why in [("ftp://h/x", "not an http(s) URL with a host"), ("http:///x", "not an http(s) URL with a host"),
                     ("https://h:99999/x", "not a URL"), ("", "empty"),
                     ("https://h/a b", "not a URL (too long, or spaces or control characters in it)"),
                     ("https://h/\x1b[2J", "not a URL (too long, or spaces or control characters in it)")]:
        with pytest.raises(InputError) as err:
            notify.receivers(["https://ok/x", bad])
        assert str(err.value) == (f"--notify #2: {why}; give an http:// or https:// URL (it is not shown here: "
                                  "it may hold a token)")
    with pytest.raises(InputError, match="at most 8"):
        notify.receivers([f"http://h/{i}" for i in range(9)])


def test_event_bodies() -> None:
    assert notify.started("r1", 10.12345, ["h1", "h2"], 4) == {
        "text": "meshrun run r1: started on 2 host(s) (h1, h2), world size 4", "event": "started", "run_id": "r1",
        "time": 10.123, "hosts": ["h1", "h2"], "world_size": 4}
    assert notify.ended("r1", 99.0, "succeeded", 88.8, None, None) == {
        "text": "meshrun run r1: finished after 89 s", "event": "finished", "run_id": "r1", "time": 99.0,
        "status": "succeeded", "duration_s": 88.8, "reason": None, "failed_host": None}
    assert notify.ended("r1", 99.0, "failed", 5, "h2 exited with status 1", "h2")["text"] == \
        "meshrun run r1: failed after 5 s: h2 exited with status 1"
    assert notify.ended("r1", 99.0, "stopped", 5, None, None)["event"] == "stopped"
    lost = MembershipEvent(50.0, Change.LOST, "h3", 2, "unreachable")
    assert notify.membership("r1", lost) == {
        "text": "meshrun run r1: host h3 lost (unreachable); world size 2", "event": "host_lost", "run_id": "r1",
        "time": 50.0, "host": "h3", "world_size": 2, "detail": "unreachable"}
    back = MembershipEvent(60.0, Change.JOINED, "h3", 3, "came back after being lost (generation 2)")
    assert notify.membership("r1", back)["event"] == "host_back"
    assert notify.membership("r1", MembershipEvent(1.0, Change.JOINED, "h4", 4))["event"] == "host_joined"
    moved = notify.membership("r1", MembershipEvent(1.0, Change.SUCCESSION, "h2", 2))
    assert moved["event"] == "rendezvous_moved" and moved["text"] == \
        "meshrun run r1: host h2 now hosts the rendezvous; world size 2"
    assert notify.membership("r1", MembershipEvent(1.0, Change.FINISHED, "h1", 2)) is None
    assert notify.membership("r1", MembershipEvent(1.0, Change.STARTED, "h1", 2)) is None


def test_sender_delivers_in_order_and_retries_a_failing_receiver() -> None:
    ok, flaky = Receiver(), Receiver(fail=2)
    reports: list[str] = []
    try:
        sender = Sender((ok.url, flaky.url), reports.append, pause_s=0.01)
        for i in range(3):
            sender.send(notify.started(f"r{i}", 1.0, ["h1"], 1))
        sender.close(30)
        assert [b["run_id"] for b in ok.bodies] == ["r0", "r1", "r2"] == [b["run_id"] for b in flaky.bodies]
        assert ok.paths == [f"/hook/{ok.token}"] * 3 and reports == []
    finally:
        ok.close()
        flaky.close()


def test_an_undeliverable_event_is_reported_without_its_url() -> None:
    down = Receiver(fail=100)
    reports: list[str] = []
    try:
        sender = Sender((down.url,), reports.append, tries=2, pause_s=0.01)
        sender.send(notify.started("r1", 1.0, ["h1"], 1))
        sender.close(30)
    finally:
        down.close()
    assert reports == ["notify: 'started' not delivered to receiver #1 (HTTP 500)"]
    closed = Sender(("http://127.0.0.1:9/x-secret",), reports.append, tries=1)
    closed.send(notify.started("r1", 1.0, ["h1"], 1))
    closed.close(30)
    assert reports[1] == "notify: 'started' not delivered to receiver #1 (ConnectionRefusedError errno 111)"
    assert not any("secret" in r or "127.0.0.1" in r for r in reports)


def test_send_never_blocks_and_the_queue_is_bounded() -> None:
    """A receiver that never answers: send returns at once, what exceeds the bound is counted."""
    gate = threading.Event()

    class Stuck(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            gate.wait(30)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender = Sender((f"http://127.0.0.1:{server.server_address[1]}/",), tries=1)
        for i in range(200):
            sender.send(notify.started(f"r{i}", 1.0, ["h1"], 1))
        assert sender.dropped >= 200 - 64 - 1  # the bound, plus the one being posted
    finally:
        gate.set()
        server.shutdown()
        server.server_close()


def _run_id() -> str:
    """One per test case: an agent ending a run stops every process of this machine tagged with its
    run id and host, so two cases on one id (pytest-xdist runs them at once) killed each other's
    commands (CI, 2026-12-05: `started, failed`)."""
    return "r-notify-" + os.urandom(3).hex()


def _detached_agent(tmp_path: Path, host: str, block: bytes, command: str, *options: str, run_id: str) -> Path:
    """A real agent started as `fab train --detach` starts it: the block on stdin, re-executed in the background."""
    tmp_path.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", run_id, "--host", host,
                           "--detach", "--env-stdin", *options, "--", "sh", "-c", command], input=block, cwd=tmp_path,
                          env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tmp_path / "runs" / run_id / "hosts" / host


def _wait_for_exit(host_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = json.loads((host_dir / "agent.json").read_text()) if (host_dir / "agent.json").exists() else {}
        if (host_dir / "exit.json").exists() and record and not _alive(record["agent_pid"]):
            return
        time.sleep(0.1)
    raise AssertionError(f"the agent of {host_dir} did not end")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("exit_code,last", [(0, "finished"), (3, "failed")])
def test_a_detached_runs_events_come_once_from_the_rendezvous_hosts_agent(tmp_path: Path, exit_code: int,
                                                                          last: str) -> None:
    """Two real detached agents (h1 hosts the rendezvous, h2 does not) get the receivers on stdin as
    the controller sends them: the receiver hears `started` and the end once, from h1's agent; the
    command's environment has the inventory's env but not the receivers."""
    receiver, run_id = Receiver(), _run_id()
    try:
        agents = []
        for host in ("h1", "h2"):
            block = notify.agent_block({"FOO": "bar"}, (receiver.url,), "h1", ["h1", "h2"])
            assert block is not None and receiver.token.encode() in block
            agents.append(_detached_agent(tmp_path / host, host, block, f"env > env.txt; exit {exit_code}",
                                          run_id=run_id))
        for host_dir in agents:
            _wait_for_exit(host_dir)
    finally:
        receiver.close()
    assert receiver.events() == ["started", last], receiver.bodies
    assert receiver.bodies[0]["hosts"] == ["h1", "h2"] and receiver.bodies[0]["world_size"] is None
    if exit_code:
        assert receiver.bodies[1]["reason"] == "h1: exit status 3" and receiver.bodies[1]["failed_host"] == "h1"
    for host in ("h1", "h2"):
        seen = (tmp_path / host / "env.txt").read_text()
        assert "FOO=bar" in seen and "MESHRUN_NOTIFY" not in seen and receiver.token not in seen
        assert not [p for p in (tmp_path / host).rglob("*") if p.is_file() and receiver.token.encode() in p.read_bytes()]


def _wait_for_events(receiver: Receiver, count: int, timeout: float = 30) -> None:
    with receiver.got:
        assert receiver.got.wait_for(lambda: len(receiver.bodies) >= count, timeout), receiver.events()


def _write_manifest(host_dir: Path, *names: str) -> None:
    manifest = host_dir.parents[1] / "checkpoints" / "MANIFEST.sha256"
    manifest.parent.mkdir(exist_ok=True)
    manifest.write_text("".join(f"{'0' * 64}  {name}\n" for name in names))


def test_a_detached_agent_tells_of_a_peer_lost_and_back_and_of_each_newer_checkpoint(tmp_path: Path) -> None:
    """A real detached agent on the rendezvous host, with one peer (a real listener standing for its
    sshd) and `--every-checkpoint`: the receiver hears the checkpoint the manifest lists, the peer lost
    when its listener closes, back when it listens again, the next checkpoint (not the same one
    twice, not best.pt) and the end, in that order, each once. The agent journals lost and back."""
    receiver, peer, run_id = Receiver(), listener(), _run_id()
    port = peer.getsockname()[1]
    try:
        block = notify.agent_block({}, (receiver.url,), "h1", ["h1", "h2"], every_checkpoint=True)
        host_dir = _detached_agent(tmp_path / "h1", "h1", block, "while [ ! -e go ]; do sleep 0.2; done",
                                   "--peers", json.dumps({"h2": f"127.0.0.1:{port}"}), run_id=run_id)
        _wait_for_events(receiver, 1)
        _write_manifest(host_dir, "ckpt-step000000010.pt", "best.pt")
        _wait_for_events(receiver, 2)
        peer.settimeout(30)
        peer.accept()[0].close()  # the watcher has seen the peer up (its first look, 2 s after its start)
        peer.close()
        _wait_for_events(receiver, 3)
        peer = listener(port)
        _wait_for_events(receiver, 4)
        _write_manifest(host_dir, "ckpt-step000000010.pt", "best.pt", "ckpt-step000000020.pt")
        _wait_for_events(receiver, 5)
        (tmp_path / "h1" / "go").touch()
        _wait_for_exit(host_dir)
    finally:
        peer.close()
        receiver.close()
    assert [(b["event"], b.get("host"), b.get("step")) for b in receiver.bodies] == [
        ("started", None, None), ("checkpoint", "h1", 10), ("host_lost", "h2", None), ("host_back", "h2", None),
        ("checkpoint", "h1", 20), ("finished", None, None)]
    assert receiver.bodies[3]["text"] == f"meshrun run {run_id}: host h2 is back (answers again)"
    journal = [json.loads(line)["event"] for line in (host_dir / "events.jsonl").read_text().splitlines()]
    assert journal == ["started", "peers_lost", "workers_restarted", "peers_back", "ended"]


def test_agent_notices_checkpoints_only_when_newer_and_asked() -> None:
    sent: list[dict] = []
    spec = {"urls": ["http://127.0.0.1:9/x"], "head": "h1", "hosts": ["h1", "h2"]}
    for every, host, expected in [(True, "h1", [10, 20]), (True, "h2", []), (False, "h1", [])]:
        sent.clear()
        notices = AgentNotices(json.dumps({**spec, "every_checkpoint": every}), "r", host)
        notices.sender = type("Fake", (), {"send": lambda self, body: sent.append(body)})()  # no HTTP: the order only
        for step in (None, 10, 10, 5, 20, None):
            notices.checkpoint(step, "")
        assert ([b["step"] for b in sent], notices.newest_checkpoint) == (expected, 20)


def test_agent_notices_take_only_a_sound_spec() -> None:
    good = json.dumps({"urls": ["http://127.0.0.1:9/x"], "head": "h1", "hosts": ["h1"]})
    assert AgentNotices(good, "r", "h1").urls == ("http://127.0.0.1:9/x",)
    for bad in ("", "[1]", "{", json.dumps({"urls": ["file:///etc/passwd"], "head": "h1", "hosts": []}),
                json.dumps({"urls": "http://x/", "head": "h1", "hosts": []}),
                json.dumps({"urls": ["http://x/"], "head": 1, "hosts": []}),
                json.dumps({"urls": ["http://x/"], "head": "h1", "hosts": [], "every_checkpoint": "yes"})):
        assert AgentNotices(bad, "r", "h1").sender is None, bad
    assert notify.agent_block({"A": "1"}, (), "h1", ["h1"]) is None
    assert json.loads(notify.agent_block({"A": "1"}, ("http://x/",), "h1", ["h1"])) == {
        "A": "1", "MESHRUN_NOTIFY": '{"urls":["http://x/"],"head":"h1","hosts":["h1"]}'}


def test_inventory_notify_is_checked_and_never_quoted(tmp_path: Path) -> None:
    from meshrun.deploy.inventory.load import load_inventory

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  h1: {address: 10.0.0.1}\nnotify:\n  - https://hooks.example/T1/secret1\n"
                   "  - http://ntfy.example:8080/topic\n")
    assert load_inventory(inv).notify == ("https://hooks.example/T1/secret1", "http://ntfy.example:8080/topic")
    inv.write_text("hosts:\n  h1: {address: 10.0.0.1}\nnotify: https://hooks.example/only\n")
    assert load_inventory(inv).notify == ("https://hooks.example/only",)
    inv.write_text("hosts:\n  h1: {address: 10.0.0.1}\nnotify:\n  - https://ok.example/a\n  - ftp://secret2.example/x\n")
    with pytest.raises(InputError) as err:
        load_inventory(inv)
    assert str(err.value) == (f"{inv}:5: field 'notify': not an http(s) URL with a host (the value is not shown: it "
                              "may hold a token); write an http:// or https:// URL")
