"""The check's own link probe must not expose the host it checks (issue 12, hole 6): its rendezvous
listener binds the training address only, it serves a bounded number of connections at once, and
it never listens longer than MAX_LIFETIME_S. Real processes and sockets on loopback: 127.0.0.2
plays the training address, 127.0.0.1 another address of the same host."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshrun.deploy.host.links import MAX_CONNECTIONS, MAX_LIFETIME_S

LINKS = Path(__file__).resolve().parents[1] / "deploy" / "host" / "links.py"
TRAINING = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((TRAINING, 0))
        return sock.getsockname()[1]


@contextmanager
def listener(rdzv_port: int | None, lifetime: float, *mode: str) -> Iterator[dict]:
    """The real listener probe on loopback; `mode` ("bind": a successor's check) after its lifetime."""
    proc = subprocess.Popen([sys.executable, str(LINKS), "listen", TRAINING,
                             str(rdzv_port) if rdzv_port else "-", str(lifetime), *mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)


def state(address: str, port: int) -> str:
    try:
        socket.create_connection((address, port), timeout=3).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"


def test_rendezvous_probe_listens_on_the_training_address_only() -> None:
    port = free_port()
    with listener(port, 30) as answer:
        assert answer["rendezvous"] == "listening"
        assert (state(TRAINING, port), state("127.0.0.1", port)) == ("open", "refused")


def test_a_port_held_on_another_address_is_still_in_use() -> None:
    """torch's store binds every address: a squatter on any one of them would stop it."""
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        with listener(squatter.getsockname()[1], 30) as answer:
            assert answer["rendezvous"] == "in use (Address already in use)"


def test_connections_over_the_cap_are_closed_at_once() -> None:
    with listener(None, 60) as answer:
        held = [socket.create_connection((TRAINING, answer["port"]), timeout=5) for _ in range(MAX_CONNECTIONS)]
        try:
            time.sleep(0.5)  # every held connection accepted and given its slot
            extra = socket.create_connection((TRAINING, answer["port"]), timeout=5)
            extra.settimeout(5)
            started = time.monotonic()
            try:
                closed = extra.recv(1) == b""
            except ConnectionResetError:
                closed = True
            except socket.timeout:
                closed = False
            assert closed and time.monotonic() - started < 4  # served connections wait 10 s for data
            extra.close()
        finally:
            for sock in held:
                sock.close()


def test_lifetime_is_bounded_whatever_is_asked() -> None:
    with listener(None, 10 ** 6) as answer:
        assert answer["lifetime"] == MAX_LIFETIME_S
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(LINKS), "listen", TRAINING, "-", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.wait(timeout=30) == 0  # stdin still open: it is the lifetime that ends it
        assert time.monotonic() - started < 30
    finally:
        proc.stdin.close()  # type: ignore[union-attr]


def test_an_address_that_is_not_the_hosts_is_answered_with_an_error_not_a_traceback() -> None:
    """192.0.2.11 (TEST-NET) is on no interface here, as an inventory `address` that is wrong."""
    done = subprocess.run([sys.executable, str(LINKS), "listen", "192.0.2.11", "-", "5"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, json.loads(done.stdout), done.stderr) == (
        0, {"error": "Cannot assign requested address"}, "")
