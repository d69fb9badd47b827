"""A host name's lookup is bounded by the connect timeout, and a name that does not resolve is said
to be one, for a target, a jump host and `fab trust` alike (stalls review, finding 7).

paramiko resolved the name (`socket.getaddrinfo`) before its connect timeout applied: a slow DNS
server held a connect for as long as the resolver liked (45 s seen with a 10 s timeout), and a
failed lookup was reported as "is sshd running and the port open?". meshrun now resolves each hop
itself, in a thread it waits for at most the connect timeout, connects the socket and hands it to
paramiko, which still checks the host key under the inventory's name and port.

`socket.getaddrinfo` is patched here, for the names these tests make up and no other: a slow or
failing resolver cannot be made otherwise without root (resolv.conf, a DNS server to point it at).
paramiko and meshrun both call the Python-level function, so the patch stands where the system's
resolver would block. The outer bound only proves each call returns.
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
from tests.standin_sshd import Keys, Mode, StandinSshd

TIMEOUT_S = 2.0
OUTER_S = 60
SLOW = ".slowdns.test"  # names whose lookup never answers (until the test ends)
MISSING = ".nxdomain.test"  # names the resolver says do not exist
LOOPBACK = "standin.test"  # a name for 127.0.0.1


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """getaddrinfo as a resolver that hangs on SLOW names, fails MISSING ones and knows LOOPBACK;
    every other name goes to the real one. Yields the names it was asked."""
    real, released, asked = socket.getaddrinfo, threading.Event(), []

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        name = str(host)
        asked.append(name)
        if name.endswith(SLOW):
            released.wait(OUTER_S)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if name.endswith(MISSING):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real("127.0.0.1" if name == LOOPBACK else host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    yield asked
    released.set()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("resolve-keys"))


def host_at(address: str, keys: Keys, port: int = 22) -> Host:
    return Host("gpu1", address, ssh_address=None, user="root", port=port, identity=str(keys.client_key), python=None,
                workdir="~/meshrun", network=None, gpus=None, nproc=1, batch_size=None, env=())


def outcome(call: Callable[[], object]) -> object:
    """call()'s value or the exception it raised, from a thread given OUTER_S to come back."""
    return bounded.outcome(call, OUTER_S)[0]


def message(call: Callable[[], object]) -> str:
    failure = outcome(call)
    assert isinstance(failure, MeshrunError), failure
    return str(failure)


FIX = "check DNS or write an IP address in the inventory"


def test_a_slow_resolver_costs_the_connect_timeout_and_is_named(resolver: list[str], keys: Keys, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    host = host_at("gpu1" + SLOW, keys)
    said = f"host 'gpu1': cannot resolve gpu1{SLOW} (no answer from the resolver within 2 s); {FIX}"
    assert message(lambda: connect(host, None, tmp_path, TIMEOUT_S)) == said
    assert message(lambda: scan_host_key(host, None, timeout=TIMEOUT_S)) == said  # fab trust


def test_a_name_that_does_not_exist_is_not_blamed_on_sshd(resolver: list[str], keys: Keys, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    host = host_at("gpu1" + MISSING, keys)
    said = f"host 'gpu1': cannot resolve gpu1{MISSING} (Name or service not known); {FIX}"
    assert message(lambda: connect(host, None, tmp_path, TIMEOUT_S)) == said
    assert message(lambda: scan_host_key(host, None, timeout=TIMEOUT_S)) == said


def test_a_jump_hosts_name_is_resolved_within_the_timeout_too(resolver: list[str], keys: Keys, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu1\n  ProxyJump j1\nHost j1\n  HostName j1{SLOW}\n")
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", str(config))
    assert message(lambda: connect(host_at("10.0.0.9", keys), None, tmp_path, TIMEOUT_S)) == (
        f"host 'gpu1': jump host j1: cannot resolve j1{SLOW} (no answer from the resolver within 2 s); check DNS "
        f"or write an IP address as HostName for Host j1 in {config}")


def test_the_host_key_is_still_checked_under_the_inventorys_name(resolver: list[str], keys: Keys, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket is connected by meshrun, to the address the name resolves to; paramiko checks the
    key against known_hosts under the name and port, as before: a key pinned under the address alone
    is not the name's, and one pinned under the name lets the connect through."""
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", os.devnull)
    with StandinSshd(keys, Mode.SILENT) as sshd:
        key = sshd.known_hosts_line().split(" ", 1)[1]
        known = tmp_path / "known_hosts"
        host = host_at(LOOPBACK, keys, sshd.port)
        known.write_text(f"[127.0.0.1]:{sshd.port} {key}")
        refused = message(lambda: connect(host, known, tmp_path, TIMEOUT_S))
        assert refused.startswith("host 'gpu1': unknown SSH host key "), refused
        known.write_text(f"[{LOOPBACK}]:{sshd.port} {key}")
        session = outcome(lambda: connect(host, known, tmp_path, TIMEOUT_S))
        assert not isinstance(session, BaseException), session
        session.close()  # type: ignore[attr-defined]
    assert LOOPBACK in resolver
