"""A host whose link dies while a long command runs is given up on within tens of seconds, not at
the command's deadline (an hour for `fab setup`); a command that hangs while SSH still answers is
said to hang, naming what was asked (stalls review, findings 2 and 9).

The host is paramiko's server side in this process, reached over socket pairs joined by a pump that
can be cut: from then on every byte is dropped and nobody is told, as when a VPN flaps or a host
loses power (no RST). The session is the real `SshSession.run`, over a real paramiko client
transport, with only its connect stubbed (the connection is handed in). The outer bounds prove that
a call ends long before its deadline; they assert no speed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

import paramiko
import pytest

from meshrun.deploy.edges import sshexec
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.datasync import VERIFY
from meshrun.deploy.edges.host_queries import NVIDIA_SMI_QUERY
from meshrun.deploy.edges.sshexec import asked
from meshrun.deploy.edges.transport import LocalSession, SshSession
from meshrun.deploy.inventory.model import Host, Network
from tests import bounded
from tests.standin_sshd import Keys
from tests.cutlink import Link, joined

pytestmark = pytest.mark.waits  # deadlines and hosts that never answer: little CPU (tests/conftest.py)
OUTER_S = 60  # a 3600 s command on a cut link must end well within this
AGENT_STATUS = ["/home/u/meshrun/.venv/bin/python", "-m", "meshrun.deploy.host.agent", "status", "--host", "gpu1"]


class StandinHost(paramiko.ServerInterface):
    """Runs commands by their text: `quiet N` sends nothing and exits 0 after N s, `hang` prints a
    line and never ends, anything else prints `ok` and exits 0. Counts the channels it grants."""

    def __init__(self) -> None:
        self.channels = 0

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        self.channels += 1
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=self._serve, args=(channel, command.decode()), daemon=True).start()
        return True

    @staticmethod
    def _serve(channel: paramiko.Channel, command: str) -> None:
        time.sleep(0.2)  # after paramiko has answered the exec request, as sshd does before the command speaks
        try:
            if "'quiet " in command:
                time.sleep(float(command.split("'quiet ")[1].split("'")[0]))
            elif "hang" in command:
                channel.sendall(b"installing torch...\n")
                time.sleep(3600)
            else:
                channel.sendall(b"ok\n")
            channel.send_exit_status(0)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class PairedSsh(SshSession):
    """The real SshSession over `transport`: its connect is the one part stubbed."""

    def __init__(self, transport: paramiko.Transport) -> None:  # noqa: super() would connect
        self.host = Host("gpu1", "10.0.0.2", ssh_address=None, user="root", port=22, identity=None, python=None,
                         workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())
        self.timeout = 10.0
        self.conn = SimpleNamespace(is_connected=True,  # type: ignore[assignment]
                                    client=SimpleNamespace(get_transport=lambda: transport))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("liveness-keys"))


@pytest.fixture
def wired(keys: Keys) -> Iterator[tuple[PairedSsh, Link, StandinHost]]:
    link, server = Link(), StandinHost()
    client, served = joined(link, server, str(keys.host_key))
    client.sock.settimeout(1.0)
    yield PairedSsh(client), link, server
    client.close()
    served.close()


def outcome(call: Callable[[], object]) -> tuple[object, float]:
    """call()'s value or the exception it raised, and the seconds it took (at most OUTER_S)."""
    return bounded.outcome(call, OUTER_S)


def test_a_cut_link_ends_an_hour_long_command_in_tens_of_seconds(wired: tuple[PairedSsh, Link, StandinHost]) -> None:
    """`fab setup`'s host side runs with a 3600 s deadline. The link is cut while it runs: the
    controller used to wait out the hour, saying nothing, then blame the command."""
    session, link, _ = wired
    threading.Timer(1.0, link.cut.set).start()
    setup = probe_argv("/usr/bin/python3", "setup", "--wheel", "hang")
    failure, _seconds = outcome(lambda: session.run(setup, timeout=3600))
    assert isinstance(failure, sshexec.StoppedAnswering), failure
    text = str(failure)
    assert text.startswith("host 'gpu1': stopped answering SSH "), text
    assert text.endswith(" s into `python3 -c <Host side of fab setup> --wheel` (link cut or host frozen); "
                         "fab check-network --hosts gpu1"), text


def test_a_cut_link_found_at_the_deadline_is_said_to_be_one(wired: tuple[PairedSsh, Link, StandinHost]) -> None:
    """A deadline shorter than the pings' quiet time: the one ping past it tells a cut link from a hang."""
    session, link, _ = wired
    threading.Timer(0.5, link.cut.set).start()
    failure, _seconds = outcome(lambda: session.run(["/usr/bin/hang"], timeout=3))
    assert str(failure) == ("host 'gpu1': stopped answering SSH 3 s into `hang` (link cut or host frozen); "
                            "fab check-network --hosts gpu1")


def test_a_command_that_hangs_while_ssh_answers_says_so(wired: tuple[PairedSsh, Link, StandinHost]) -> None:
    """A host whose workdir's NFS hangs: SSH answers, the command never ends. It was "`/…/python`
    took more than 2 s", which named an interpreter and said nothing of what to do."""
    session, _, _ = wired
    failure, _seconds = outcome(lambda: session.run([*AGENT_STATUS[:-2], "hang"], timeout=2))
    assert isinstance(failure, sshexec.NotFinished)  # `fab status` can tell it from an unreachable host
    assert str(failure) == (
        "host 'gpu1': `python -m meshrun.deploy.host.agent status` did not finish within 2 s though SSH answers: "
        "the host may be overloaded or its disk (NFS?) hung; fab check-network --hosts gpu1")


def test_short_commands_are_not_pinged(wired: tuple[PairedSsh, Link, StandinHost]) -> None:
    """A ping is a channel the host's sshd grants: the many short commands must not pay for one."""
    session, _, server = wired
    assert session.run(["echo", "x"], timeout=30).stdout == "ok\n"
    assert session.run(["sleep", "quiet 2"], timeout=30).ok
    assert server.channels == 2  # the two commands' own


def test_a_quiet_command_on_a_live_link_is_pinged_and_finishes(wired: tuple[PairedSsh, Link, StandinHost],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Quiet past QUIET_BEFORE_PING_S (shortened here), the host is pinged, answers, and the command
    runs to its end: a slow host is not declared lost."""
    monkeypatch.setattr(sshexec, "QUIET_BEFORE_PING_S", 0.5)
    session, _, server = wired
    result, _seconds = outcome(lambda: session.run(["sleep", "quiet 4"], timeout=30))
    assert getattr(result, "ok", False), result
    assert server.channels > 1  # the command's and the pings'


def test_what_was_asked_names_the_program_and_what_tells_the_command_apart() -> None:
    assert asked(AGENT_STATUS) == "`python -m meshrun.deploy.host.agent status`"
    assert asked(probe_argv("~/venv/bin/python3", "facts", "light")) == \
        "`python3 -c <Host-side fact probe for fab check-network> light`"
    assert asked(["python3", "-I", "-S", "-c", "import os\nprint(1)\n", "/data"]) == "`python3 -I -S -c <a 2-line script> /data`"
    assert asked(["/usr/bin/python3", "-c", VERIFY, "/data/x", "MANIFEST"]) == \
        f"`python3 -c <a {len(VERIFY.strip().splitlines())}-line script> /data/x`"
    assert asked(["/usr/bin/nvidia-smi", *NVIDIA_SMI_QUERY]) == f"`nvidia-smi {NVIDIA_SMI_QUERY[0]}`"
    assert asked(["true"]) == "`true`"
    assert asked(["printenv", "SSH_CONNECTION"]) == "`printenv SSH_CONNECTION`"
    assert asked(["/bin/x\nrm", "a" * 70]) == "`x\\nrm " + "a" * 63 + "…`"
    assert asked(["~/venv/bin/python"]) == "`python`"


def test_a_local_command_past_its_deadline_names_what_was_asked(tmp_path: Path) -> None:
    """`address: local` runs no SSH: its hang is this machine's, said with the same words for what was asked."""
    local = Host("gpu1", "local", ssh_address=None, user=None, port=None, identity=None, python=None, workdir=".",
                 network=None, gpus=None, nproc=1, batch_size=None, env=())
    failure, _seconds = outcome(lambda: LocalSession(local, tmp_path).run(["/bin/sleep", "30"], timeout=1))
    assert str(failure) == ("host 'gpu1': `sleep 30` did not finish within 1 s: this machine may be overloaded or "
                            "its disk (NFS?) hung")
