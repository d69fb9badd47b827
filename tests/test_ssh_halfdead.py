"""A half-dead sshd, one that accepts the TCP connection and never says a word (a host frozen under
load, a wedged sshd), is named as such: "accepted the connection but its sshd said nothing within
N s", for a target, a jump host and `fab trust`'s key scan alike (stalls review, finding 3).

paramiko's `start_client(timeout)` returns at its timeout without raising, and the next step said
"No existing session", which the controller turned into "is sshd running and the port open?": the
wrong advice for a host whose kernel answered. The host here is a listening socket nobody accepts
on (tests/trap.py): the kernel completes the handshake and nothing ever speaks. The outer bound only
proves each call returns.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from meshrun.deploy.edges.transport import connect, scan_host_key
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from tests import bounded
from tests.standin_sshd import Keys
from tests.trap import dialled, listening_trap

TIMEOUT_S = 3.0  # the connect timeout given: the messages name it
pytestmark = pytest.mark.waits  # deadlines and hosts that never answer: little CPU (tests/conftest.py)
OUTER_S = 60


@pytest.fixture
def trap() -> Iterator[socket.socket]:
    yield from listening_trap()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("halfdead-keys"))


def host_at(port: int, keys: Keys, address: str = "127.0.0.1", name: str = "gpu1") -> Host:
    return Host(name, address, ssh_address=None, user="root", port=port, identity=str(keys.client_key), python=None,
                workdir="~/meshrun", network=None, gpus=None, nproc=1, batch_size=None, env=())


def raised(call: Callable[[], object]) -> str:
    """The MeshrunError call() raised, from a thread given OUTER_S to come back."""
    error = bounded.outcome(call, OUTER_S)[0]
    assert isinstance(error, MeshrunError), error
    return str(error)


def silent_line(who: str, port: int) -> str:
    return (f"{who}: 127.0.0.1:{port} accepted the connection but its sshd said nothing within {TIMEOUT_S:.0f} s; "
            "is the host overloaded or frozen?")


def test_connect_to_a_silent_sshd_says_it_said_nothing(trap: socket.socket, keys: Keys, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    port = trap.getsockname()[1]
    assert raised(lambda: connect(host_at(port, keys), None, tmp_path, TIMEOUT_S)) == silent_line("host 'gpu1'", port)
    assert dialled(trap) == 1


def test_fab_trusts_key_scan_of_a_silent_sshd_says_it_said_nothing(trap: socket.socket, keys: Keys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    port = trap.getsockname()[1]
    assert raised(lambda: scan_host_key(host_at(port, keys), None, timeout=TIMEOUT_S)) == \
        silent_line("host 'gpu1'", port)


def test_a_silent_jump_host_is_named_and_asked_once(trap: socket.socket, keys: Keys, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A jump host whose sshd is wedged: one line naming it, and no retries (those are for an sshd
    that turns a connection away before its banner, which this one never does)."""
    port = trap.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu1\n  ProxyJump j1\nHost j1\n  HostName 127.0.0.1\n  Port {port}\n")
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", str(config))
    target = host_at(22, keys, address="10.0.0.9")
    assert raised(lambda: connect(target, None, tmp_path, TIMEOUT_S)) == silent_line("host 'gpu1': jump host j1", port)
    assert dialled(trap) == 1
    assert raised(lambda: scan_host_key(target, None, hop=0, timeout=TIMEOUT_S)) == \
        silent_line("host 'gpu1': jump host j1", port)


def test_a_server_that_sends_something_else_is_not_said_to_be_silent(keys: Keys, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes that are not an SSH greeting (and no newline, so no banner is ever read): whatever that
    server is, it did not say nothing, and the message must not claim it did."""
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        def babble() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request")
                stop.wait(OUTER_S)

        threading.Thread(target=babble, daemon=True).start()
        text = raised(lambda: connect(host_at(server.getsockname()[1], keys), None, tmp_path, TIMEOUT_S))
        stop.set()
    assert text.startswith("host 'gpu1': ") and "said nothing" not in text, text
