"""The exposure check asks whether the controller is itself a host by binding each host's address
(deploy/edges/exposure.py `_is_own`). Only a literal IP address counts (findings "stalls", 7): a
host name was resolved by the bind, one host after another on the main thread with no bound on the
lookup (5 hosts behind a 3 s DNS: 15 s before any probe)."""

from __future__ import annotations

import socket

import pytest

from meshrun.deploy.edges import exposure


@pytest.fixture
def binds(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every address a socket of the exposure check is bound to (the real bind then runs)."""
    seen: list[object] = []
    real = socket.socket

    class Recording(real):  # type: ignore[misc, valid-type]
        def bind(self, address: object) -> None:
            seen.append(address)
            super().bind(address)

    monkeypatch.setattr(exposure.socket, "socket", Recording)
    return seen


def test_a_host_name_is_not_looked_up(binds: list[object]) -> None:
    assert [exposure._is_own(name) for name in ("gpu1.lan", "localhost", "local", "")] == [False] * 4
    assert binds == []


def test_a_literal_address_of_this_machine_is_its_own(binds: list[object]) -> None:
    assert exposure._is_own("127.0.0.1") is True
    assert exposure._is_own("192.0.2.1") is False  # TEST-NET-1: no machine's own
    assert binds == [("127.0.0.1", 0), ("192.0.2.1", 0)]
