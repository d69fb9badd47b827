"""Every channel the controller opens (a liveness probe every 2 s per host for a whole attached run,
every command of its polls) left its id in paramiko's `Transport.channels_seen`, which paramiko never
empties: ~70 MB a week at 3 hosts (review longrun56, finding 3). Now only the newest closed ones are
kept (`sshexec.forget_old_channels`); paramiko needs them to ignore a late message for a closed
channel rather than end the whole connection on an unknown id.

The host is tests/standin_sshd.py (paramiko's server side on loopback, running commands as this
user), reached by the real SshSession over a real connect, with a pinned host key and a key login.
paramiko's server sends a command's exit status even after the client closed the channel: the late
message the kept ids are for, from a real SSH server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.deploy.edges import sshexec
from meshrun.deploy.edges.transport import SshSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network
from tests.standin_sshd import Keys, Mode, StandinSshd

CHANNELS = 30  # pings and as many commands: far past 2 * KEEP
KEEP = 4  # KEEP_CLOSED_CHANNELS for these tests: 256 would need 513 channels before the first is forgotten
OUTER_S = 30  # for the drops' threads to be done; it asserts no speed


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
    """len(channels_seen) once the drops' threads (each closes its channel, then trims) are done: at
    most OUTER_S, the last count when it never comes down."""
    seen = session.conn.client.get_transport().channels_seen
    deadline = time.monotonic() + OUTER_S
    while len(seen) > 2 * KEEP + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(seen)


@pytest.fixture
def keep_few(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshexec, "KEEP_CLOSED_CHANNELS", KEEP)


def test_pings_and_commands_leave_a_bounded_number_of_channel_ids(session: SshSession, keep_few: None) -> None:
    for count in range(CHANNELS):
        assert session.ping(5.0)
        assert session.run(["echo", f"n{count}"], timeout=30).stdout == f"n{count}\n"
    assert seen_after_settling(session) <= 2 * KEEP + 1  # the newest closed ones, and one maybe still open


def test_a_late_message_for_a_recently_closed_channel_keeps_the_connection(session: SshSession,
                                                                         keep_few: None) -> None:
    """A command given up on (its deadline passed) is closed by the controller; paramiko's server then
    sends its exit status when it ends. Older channels are forgotten meanwhile, but that one's id is
    among the newest KEEP closed ones, so paramiko ignores the message (forgotten, it would end the
    connection: with KEEP 0 this test fails). Commands and pings go on over the same connection."""
    transport = session.conn.client.get_transport()
    for _ in range(2 * KEEP):  # older closed channels: the next drops forget them
        assert session.ping(5.0)
    with pytest.raises(MeshrunError, match="did not finish within"):
        session.run(["sleep", "3"], timeout=1)  # its drop, and one ping past its deadline
    assert session.ping(5.0)  # a drop once the sleep's channel is closed and let go of
    time.sleep(3)  # the sleep has ended and its exit status arrived
    assert session.run(["echo", "after"], timeout=30).stdout == "after\n"
    assert transport.is_active() and session.conn.client.get_transport() is transport  # never reconnected
