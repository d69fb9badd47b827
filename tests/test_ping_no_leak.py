"""Every liveness probe (`SshSession.ping`: a channel granted and closed unused, every 2 s per host
for a whole attached run) left its channel id in paramiko's `Transport.channels_seen`, which paramiko
never empties: ~70 MB a week at 3 hosts, ~0.7 GB at 32 (review longrun56, finding 3). Now a probe's
id is forgotten once the host has closed the channel as well; until then paramiko needs it to ignore
a late message for that channel rather than end the whole connection on an unknown id.

The host is tests/standin_sshd.py (paramiko's server side on loopback, running commands as this
user), reached by the real SshSession over a real connect, with a pinned host key and a key login."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.edges.transport import SshSession
from meshrun.deploy.inventory.model import Host, Network
from tests.standin_sshd import Keys, Mode, StandinSshd

PINGS = 100
OUTER_S = 30  # for the host's closes of the last probes to arrive; it asserts no speed


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("ping-keys"))


@pytest.fixture
def session(keys: Keys, tmp_path: Path) -> Iterator[SshSession]:
    home = tmp_path / "home"
    home.mkdir()
    with StandinSshd(keys, Mode.REAL, home=home) as sshd:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(sshd.known_hosts_line())
        host = Host("h1", "127.0.0.1", ssh_address=None, user="root", port=sshd.port, identity=str(keys.client_key),
                    python=None, workdir=str(home), network=Network.LAN, gpus=None, nproc=None, batch_size=None,
                    env=())
        opened = SshSession(host, known_hosts).open()
        try:
            yield opened
        finally:
            opened.close()


def seen_after_settling(session: SshSession) -> int:
    """len(channels_seen) once a further ping finds the host's closes of the earlier probes arrived
    (each ping forgets those): at most OUTER_S of pinging, the last count when it never settles."""
    seen = session.conn.client.get_transport().channels_seen
    deadline = time.monotonic() + OUTER_S
    while True:
        assert session.ping(5.0)
        if len(seen) <= 2 or time.monotonic() > deadline:
            return len(seen)
        time.sleep(0.1)


def test_pings_leave_a_bounded_number_of_channel_ids(session: SshSession) -> None:
    for _ in range(PINGS):
        assert session.ping(5.0)
    assert seen_after_settling(session) <= 2  # the last probe's, and one whose close may still be on its way


def test_commands_between_pings_still_get_their_answers(session: SshSession) -> None:
    """An id is forgotten only after the host's own close: removed sooner, the exit status or the close
    the host sends after ours would name a channel paramiko does not know, and it would end the whole
    connection. Each command's answer comes, and the connection stays up."""
    transport = session.conn.client.get_transport()
    for count in range(20):
        assert session.ping(5.0)
        assert session.run(["echo", f"n{count}"], timeout=30).stdout == f"n{count}\n"
    assert transport.is_active() and session.ping(5.0)
    assert session.conn.client.get_transport() is transport  # never reconnected
