"""ssh_config's `Include` and `IdentityAgent` (deploy.edges.sshtarget), the rsync ssh argv they give
(deploy.edges.sshargv) and the agent paramiko is handed (deploy.edges.sshopen): pure, exact equality.
$MESHRUN_SSH_CONFIG and $HOME point at tmp files; nothing is contacted."""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import paramiko
import pytest

from meshrun.deploy.edges import sshargv, sshopen, sshtarget
from meshrun.deploy.edges.sshtarget import AGENT_NONE, Hop
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.model import Host, Network
from meshrun.layout import ENV_SSH_CONFIG

LAB = "Host gpu1\n  HostName 127.0.0.1\n  Port 2201\n  User alice\n  IdentityFile ~/.ssh/labkey\n"


def host(name: str, address: str) -> Host:
    return Host(name, address, ssh_address=None, user=None, port=None, identity=None, python=None,
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "me")
    monkeypatch.setenv("LOGNAME", "me")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def config(home: Path, monkeypatch: pytest.MonkeyPatch, text: str, files: dict[str, str] | None = None) -> Path:
    """The main config at ~/.ssh/main (named by $MESHRUN_SSH_CONFIG), the others relative to ~/.ssh."""
    for name, body in (files or {}).items():
        path = home / ".ssh" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    main = home / ".ssh/main"
    main.write_text(text)
    monkeypatch.setenv(ENV_SSH_CONFIG, str(main))
    return main


def test_a_host_in_a_globbed_include_relative_to_dot_ssh_resolves_as_ssh_does(home: Path, monkeypatch) -> None:
    main = config(home, monkeypatch, "Include config.d/*\nHost *\n  User nobody\n",
                  {"config.d/20-lab": LAB, "config.d/10-first": "Host gpu1\n  Port 2299\n"})
    assert sshtarget.resolve(host("gpu1", "10.147.17.11")).target == Hop(
        "gpu1", "127.0.0.1", "alice", 2299, (str(home / ".ssh/labkey"),), f"IdentityFile for Host gpu1 in {main}")


def test_lines_after_an_include_stay_in_their_block_and_absolute_paths_are_followed(home: Path, monkeypatch) -> None:
    other = home / "elsewhere.conf"
    other.write_text("Port 2202\nHost unrelated\n  User bob\n")
    config(home, monkeypatch, f"Host gpu2\n  HostName 127.0.0.2\n  Include {other}\n  User carol\n"
                              "  Include missing-is-skipped ~/nothing/*\n")
    assert sshtarget.resolve(host("gpu2", "10.0.0.2")).target == Hop("gpu2", "127.0.0.2", "carol", 2202, (), "")


def test_includes_nested_deeper_than_16_are_one_line(home: Path, monkeypatch) -> None:
    main = config(home, monkeypatch, "Include main\n")
    with pytest.raises(InputError) as err:
        sshtarget.resolve(host("gpu1", "10.0.0.1"))
    assert str(err.value) == (f"ssh_config {main}: Include nested deeper than 16 (does it include itself?); "
                              f"fix the file or set {ENV_SSH_CONFIG}")


def test_an_unreadable_include_is_one_line_naming_it(home: Path, monkeypatch) -> None:
    config(home, monkeypatch, "Include config.d\n", {"config.d/x": ""})
    with pytest.raises(InputError) as err:
        sshtarget.resolve(host("gpu1", "10.0.0.1"))
    assert str(err.value).startswith(f"ssh_config {home}/.ssh/config.d is a directory")


def test_identity_agent_is_expanded_or_refused(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("MY_SOCK", "/run/agent.sock")
    config(home, monkeypatch, "Host a\n IdentityAgent ~/.1password/agent.sock\nHost b\n IdentityAgent none\n"
                              "Host c\n IdentityAgent SSH_AUTH_SOCK\nHost d\n IdentityAgent \"%d/s %%1 %u\"\n"
                              "Host e\n IdentityAgent $MY_SOCK\nHost f\n IdentityAgent /tmp/%h.sock\n"
                              "Host g\n IdentityAgent /run/user/%i/gnupg/S.gpg-agent.ssh\n")
    agents = [sshtarget.resolve(host(name, "10.0.0.9")).target.agent for name in "abcdeg"]
    assert agents == [f"{home}/.1password/agent.sock", AGENT_NONE, "", f"{home}/s %1 me", "/run/agent.sock",
                      f"/run/user/{os.getuid()}/gnupg/S.gpg-agent.ssh"]  # gpg-agent's: %i is the uid, as ssh's
    with pytest.raises(InputError) as err:
        sshtarget.resolve(host("f", "10.0.0.9"))
    assert str(err.value) == (f"host 'f': {home}/.ssh/main: IdentityAgent '/tmp/%h.sock' for Host 'f' is not a "
                              "socket path (meshrun expands ~, %d, %i, %u and %% only); write the path out")


def test_an_agent_only_key_passes_check_keys_and_a_missing_socket_is_named(home: Path, monkeypatch) -> None:
    main = config(home, monkeypatch, "Host gpu1\n  IdentityAgent ~/agent.sock\n")
    target = sshtarget.resolve(host("gpu1", "10.0.0.1"))
    with pytest.raises(MeshrunError) as err:
        sshtarget.check_keys(target)
    assert str(err.value) == (f"host 'gpu1': IdentityAgent {home}/agent.sock for Host gpu1 in {main} does not "
                              "exist, and no other key is set; start that agent (1Password, Secretive, ...) or fix "
                              "IdentityAgent")
    (home / "agent.sock").write_text("")
    sshtarget.check_keys(target)  # before: "no SSH key to offer gpu1 ... set `identity: ~/.ssh/<key>`"


def test_a_missing_agent_socket_is_skipped_where_the_hop_has_another_key(home: Path, monkeypatch) -> None:
    """1Password's `Host *` block synced to a machine without it: ssh skips the agent and logs in with
    the IdentityFile (or ~/.ssh/id_*); so does meshrun, whose agent for the hop then lists no keys."""
    gone = home / "Library/Group Containers/2BUA8C4S2C.com.1password/t/agent.sock"
    config(home, monkeypatch, f'{LAB}Host *\n  IdentityAgent "{gone}"\n')
    (home / ".ssh/labkey").write_text("key")
    target = sshtarget.resolve(host("gpu1", "10.147.17.11"))
    assert (target.target.identities, target.target.agent) == ((str(home / ".ssh/labkey"),), str(gone))
    sshtarget.check_keys(target)  # before: "IdentityAgent ... does not exist; start that agent"
    other = sshtarget.resolve(host("gpu2", "10.147.17.12"))  # no IdentityFile: ~/.ssh/id_ed25519 is the key
    (home / ".ssh/id_ed25519").write_text("key")
    sshtarget.check_keys(other)
    assert sshopen.SocketAgent(str(gone)).get_keys() == ()
    refused = sshopen.login_refused("host 'gpu2'", "root@10.147.17.12:22", other.target, None, other.config,
                                    paramiko.AuthenticationException("Authentication failed."))
    assert f"the key (~/.ssh/id_*: the IdentityAgent socket {gone} is not there)" in str(refused)


def test_rsyncs_ssh_is_told_the_agent(home: Path) -> None:
    hop = Hop("gpu1", "10.0.0.1", "alice", 22, (), "", False, f"{home}/My Agent/a%.sock")
    assert sshargv.hop_argv(hop, (), []) == ["ssh", "-p", "22", "-o", "HostName=10.0.0.1", "-o",
                                             f'IdentityAgent="{home}/My Agent/a%%.sock"', "-l", "alice"]
    none = Hop("gpu1", "10.0.0.1", "alice", 22, (), "", False, AGENT_NONE)
    assert sshargv.hop_argv(none, (), [])[5:7] == ["-o", "IdentityAgent=none"]
    assert "IdentityAgent" not in " ".join(sshargv.hop_argv(Hop("g", "10.0.0.1", "a", 22, (), ""), (), []))


def listening(path: Path) -> socket.socket:
    """A unix socket at `path` that takes one client: the agents below."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def identities(blob: bytes, comment: bytes) -> bytes:
    """An agent's SSH2_AGENT_IDENTITIES_ANSWER listing one key, framed."""
    body = bytes([12]) + struct.pack(">II", 1, len(blob)) + blob + struct.pack(">I", len(comment)) + comment
    return struct.pack(">I", len(body)) + body


def fake_agent(path: Path, blob: bytes) -> threading.Thread:
    """An agent at `path` that lists one key (`blob`) to one client."""
    server = listening(path)

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            conn.recv(4096)  # SSH2_AGENTC_REQUEST_IDENTITIES
            conn.sendall(identities(blob, b"1pwd"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_paramiko_is_handed_the_identity_agents_keys(tmp_path: Path) -> None:
    blob = paramiko.RSAKey.generate(1024).asbytes()
    sock = Path(f"/tmp/meshrun-agent-{os.getpid()}.sock")  # AF_UNIX paths are short: not under tmp_path
    try:
        thread = fake_agent(sock, blob)
        hop = Hop("gpu1", "10.0.0.1", "alice", 22, (), "", False, str(sock))
        conn = sshopen.connection(hop, None, None, 5.0)
        assert isinstance(conn.client, sshopen.AgentClient) and conn.client.agent_path == str(sock)
        conn.client._agent = agent = sshopen.SocketAgent(str(sock))  # what AgentClient.connect sets
        assert [k.asbytes() for k in agent.get_keys()] == [blob]
        agent.close()  # SSHClient.close() calls it once connected; paramiko's AgentSSH has none
        assert agent.get_keys() == ()
        thread.join(5)
    finally:
        sock.unlink(missing_ok=True)
    assert sshopen.SocketAgent(str(tmp_path / "gone.sock")).get_keys() == ()
    off = sshopen.connection(Hop("g", "10.0.0.1", "a", 22, (), "", False, AGENT_NONE), None, None, 5.0)
    assert off.connect_kwargs["allow_agent"] is False and type(off.client) is paramiko.SSHClient


def silent_agent(path: Path, blob: bytes | None) -> threading.Thread:
    """An agent at `path` that accepts one client and never answers (`blob` None), or lists one key
    (`blob`) and then never answers the signing request; it lets go when the client closes."""
    server = listening(path)

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            conn.recv(4096)
            if blob is not None:
                conn.sendall(identities(blob, b""))
            while conn.recv(4096):  # the request is read and never answered, until the client closes
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_an_agent_that_never_answers_is_named_not_waited_for(monkeypatch) -> None:
    """A wedged or stopped agent blocked the connect for ever (`fab join` hung, a rejoin thread never
    returned): its listing is bounded as the connect is, its signing by AGENT_SIGN_TIMEOUT_S, and the
    error names the agent, not the host."""
    monkeypatch.setattr(sshtarget, "CONNECT_TIMEOUT_S", 0.2)  # short bounds: the test checks that they hold
    monkeypatch.setattr(sshopen, "AGENT_SIGN_TIMEOUT_S", 0.2)
    sock = Path(f"/tmp/meshrun-silent-{os.getpid()}.sock")
    try:
        thread = silent_agent(sock, None)
        with pytest.raises(sshopen.AgentSilent) as err:
            sshopen.SocketAgent(str(sock))
        assert str(err.value) == (f"the SSH agent at IdentityAgent {sock} accepted the connection but did not list "
                                  "its keys within 0.2 s; restart that agent, or set IdentityAgent to another agent or "
                                  "none")
        thread.join(5)
        sock.unlink()
        blob = paramiko.RSAKey.generate(1024).asbytes()
        thread = silent_agent(sock, blob)
        agent = sshopen.SocketAgent(str(sock))
        with pytest.raises(sshopen.AgentSilent) as err:
            agent.get_keys()[0].sign_ssh_data(b"session", "rsa-sha2-256")
        assert "did not sign (a key waiting for a touch or a click?) within 0.2 s" in str(err.value)
        agent.close()
        thread.join(5)
    finally:
        sock.unlink(missing_ok=True)

    class Wedged:
        def open(self) -> None:
            raise err.value  # what paramiko's connect passes on from its transport thread

    hop = Hop("gpu1", "10.0.0.1", "alice", 22, (), "", False, str(sock))
    with pytest.raises(MeshrunError) as opened:
        sshopen.open_hop(Wedged(), hop, None, sshopen.Opening("gpu1", None, Path("/dev/null"), 30.0))  # type: ignore[arg-type]
    assert str(opened.value) == f"host 'gpu1': {err.value}"
