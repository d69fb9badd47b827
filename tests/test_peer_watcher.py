"""The agents' probes of each other (detached elastic runs), on real sockets on loopback: a peer
is reported once after it stopped answering, once when it answers again, again lost only after
it answered in between, and never
if it was never seen up (deploy/host/succession.py::PeerWatcher). A closed port refuses at once,
like a killed host; a cut link's timeouts are the elastic tests' business (tests/test_elastic.py)."""

from __future__ import annotations

import socket
import time

import pytest

from meshrun.deploy.host import succession
from meshrun.deploy.host.succession import PeerWatcher, parse_peers


@pytest.fixture(autouse=True)
def fast_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(succession, "PROBE_EVERY_S", 0.1)


def listener(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)
    return sock


def free_port() -> int:
    with listener() as sock:
        return sock.getsockname()[1]


def lost_within(watcher: PeerWatcher, seconds: float) -> list[str]:
    deadline, lost = time.monotonic() + seconds, []
    while time.monotonic() < deadline and not lost:
        lost = watcher.take_lost()
        time.sleep(0.05)
    return lost


def test_a_peer_that_stops_answering_is_reported_once_and_again_after_it_came_back() -> None:
    port, never = free_port(), free_port()
    up = listener(port)
    watcher = PeerWatcher(parse_peers(f'{{"b": "127.0.0.1:{port}", "c": "127.0.0.1:{never}"}}'))
    try:
        assert lost_within(watcher, 1.0) == []  # b answers; c was never seen, so it is not news
        up.close()
        assert lost_within(watcher, 5.0) == ["b"]
        assert lost_within(watcher, 1.0) == []  # reported once, not on every miss
        assert watcher.take_back() == []
        up = listener(port)
        time.sleep(0.5)  # b answers again ...
        assert (watcher.take_back(), watcher.take_back()) == (["b"], [])  # ... said once (host_back)
        up.close()
        assert lost_within(watcher, 5.0) == ["b"]  # ... so its next loss is news again
    finally:
        watcher.stop()
        up.close()


def test_peers_json_is_names_to_endpoints() -> None:
    assert parse_peers('{"h2": "10.0.0.2:22", "h3": "[fd00::3]:2222"}') == {"h2": "10.0.0.2:22", "h3": "[fd00::3]:2222"}
