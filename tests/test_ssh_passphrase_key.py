"""A passphrase-protected key that no SSH agent holds (macos55 finding 4): `ssh host` logs in (OpenSSH
asks for the passphrase, or macOS's Keychain gives it with UseKeychain, which paramiko ignores), and
meshrun said the login was refused and to check authorized_keys. paramiko raises
PasswordRequiredException, an AuthenticationException, without asking the host anything.

The sessions are the controller's real ones (SshSession: the inventory and ssh_config read, the key
checks, paramiko's login) against a stand-in sshd on loopback (tests/standin_sshd.py); the keys are
made by ssh-keygen. $HOME and the ssh_config are tmp files and $SSH_AUTH_SOCK is unset, so no agent of
this machine's user is reachable; the one agent used is a stand-in on a unix socket, named by IdentityAgent.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import paramiko
import pytest

from meshrun.deploy.edges import sshopen
from meshrun.deploy.edges.sshtarget import AGENT_NONE, Hop
from meshrun.deploy.edges.transport import SshSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network
from meshrun.layout import ENV_SSH_CONFIG
from tests.standin_sshd import Keys, Mode, StandinSshd

SECRET = "secret"


def keygen(path: Path, passphrase: str, *kind: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", *(kind or ("-t", "ed25519")), "-N", passphrase, "-C", "", "-f", str(path)],
                   check=True, timeout=30)
    return path


def unlocked(key: Path) -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(key), password=SECRET)


def inventory_host(port: int, identity: str | None) -> Host:
    return Host("gpu1", "127.0.0.1", ssh_address=None, user="alice", port=port, identity=identity, python=None,
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no agent of this machine's user
    monkeypatch.setenv(ENV_SSH_CONFIG, str(home / ".ssh" / "config"))
    return home


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[StandinSshd]:
    with StandinSshd(Keys.make(tmp_path / "standin"), Mode.SILENT) as server:
        yield server


def pins(tmp_path: Path, sshd: StandinSshd) -> Path:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    return known


def login(host: Host, known: Path) -> str:
    """The one line a session's open raises, or "logged in"."""
    session = SshSession(host, known, connect_timeout=10.0)
    try:
        session.open()
    except MeshrunError as err:
        return str(err)
    session.close()
    return "logged in"


def test_an_inventory_identity_with_a_passphrase_is_named_with_ssh_add(tmp_path: Path, home: Path,
                                                                       sshd: StandinSshd) -> None:
    key = keygen(tmp_path / "work key", SECRET)  # a space: the ssh-add it names is quoted
    sshd.client_public = unlocked(key)  # the host lets this very key in
    known = pins(tmp_path, sshd)
    said = login(inventory_host(sshd.port, str(key)), known)
    quoted = f"'{key}'"
    assert said == (f"host 'gpu1': SSH login to alice@127.0.0.1:{sshd.port}: the key {key} is passphrase-protected "
                    f"and no SSH agent holds it; run `ssh-add {quoted}` (on macOS `ssh-add --apple-use-keychain "
                    f"{quoted}`); meshrun does not read UseKeychain or ask for passphrases")
    # The same key without its passphrase logs in: the host was never the problem.
    plain = tmp_path / "plain"
    shutil.copyfile(key, plain)
    plain.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", SECRET, "-N", "", "-f", str(plain)], check=True, timeout=30)
    assert login(inventory_host(sshd.port, str(plain)), known) == "logged in"


def test_a_default_key_with_a_passphrase_is_named(tmp_path: Path, home: Path, sshd: StandinSshd) -> None:
    """No `identity`, no IdentityFile: paramiko reads ~/.ssh/id_ed25519, as a Mac user's ssh does."""
    key = keygen(home / ".ssh" / "id_ed25519", SECRET)
    sshd.client_public = unlocked(key)
    said = login(inventory_host(sshd.port, None), pins(tmp_path, sshd))
    assert said == (f"host 'gpu1': SSH login to alice@127.0.0.1:{sshd.port}: the key {key} is passphrase-protected "
                    f"and no SSH agent holds it; run `ssh-add {key}` (on macOS `ssh-add --apple-use-keychain {key}`); "
                    "meshrun does not read UseKeychain or ask for passphrases")


def test_a_key_the_agent_holds_and_the_host_refuses_is_still_a_refused_login(tmp_path: Path, home: Path,
                                                                             sshd: StandinSshd) -> None:
    """paramiko offers the agent's keys, then reads ~/.ssh/id_*: with the agent's copy refused, its last
    error is that file's passphrase. ssh-add would change nothing: the host lacks the key."""
    key = keygen(home / ".ssh" / "id_ed25519", SECRET)
    sock = Path(f"/tmp/meshrun-keyagent-{os.getpid()}.sock")  # AF_UNIX paths are short: not under tmp_path
    (home / ".ssh" / "config").write_text(f"Host gpu1\n  IdentityAgent {sock}\n")
    try:
        with SigningAgent(sock, unlocked(key)) as agent:  # sshd's client_public stays its own other key
            said = login(inventory_host(sshd.port, None), pins(tmp_path, sshd))
            assert agent.signed >= 1  # the agent's copy was offered to the host
    finally:
        sock.unlink(missing_ok=True)
    assert said == (f"host 'gpu1': SSH login to alice@127.0.0.1:{sshd.port} refused (Authentication failed.); check "
                    f"the user and the key (the agent at IdentityAgent {sock}), and that the key is in the host's "
                    "authorized_keys")


def test_the_keys_paramiko_cannot_unlock_are_found_among_those_it_tries(tmp_path: Path, home: Path) -> None:
    locked = keygen(tmp_path / "locked", SECRET)
    pem = keygen(tmp_path / "legacy_pem", SECRET, "-t", "rsa", "-b", "2048", "-m", "PEM")
    plain = keygen(tmp_path / "plain", "")
    default = keygen(home / ".ssh" / "id_rsa", SECRET, "-t", "rsa", "-b", "2048")
    hop = Hop("gpu1", "127.0.0.1", "alice", 22, (str(locked), str(pem), str(plain), str(tmp_path / "gone")),
              "`identity` in the inventory")
    assert sshopen.locked_keys(hop) == (str(locked), str(pem), str(default))
    assert sshopen.public_blob(str(locked)) == unlocked(locked).asbytes()
    assert sshopen.public_blob(str(tmp_path / "gone")) is None


def test_unheld_keeps_the_keys_whose_public_half_the_agent_lacks_or_is_unknown() -> None:
    assert sshopen.unheld(("a", "b", "c"), (b"A", b"B", None), {b"A"}) == ("b", "c")
    assert sshopen.unheld(("a",), (b"A",), {b"A", b"X"}) == ()
    assert sshopen.unheld((), (), set()) == ()


def hop(agent: str = "") -> Hop:
    return Hop("gpu1", "10.0.0.1", "alice", 22, (), "", False, agent)


def test_the_words_for_each_agent() -> None:
    tail = "meshrun does not read UseKeychain or ask for passphrases"
    config = Path("/home/me/.ssh/config")
    assert str(sshopen.passphrase_needed("host 'gpu1'", "alice@10.0.0.1:22", ["/k/id_ed25519"], hop(), config)) == (
        "host 'gpu1': SSH login to alice@10.0.0.1:22: the key /k/id_ed25519 is passphrase-protected and no SSH agent "
        "holds it; run `ssh-add /k/id_ed25519` (on macOS `ssh-add --apple-use-keychain /k/id_ed25519`); " + tail)
    assert str(sshopen.passphrase_needed("host 'gpu1': jump host login", "bob@10.0.0.9:22", ["/k/a", "/k/b"], hop(),
                                         config)) == (
        "host 'gpu1': jump host login: SSH login to bob@10.0.0.9:22: the keys /k/a, /k/b are passphrase-protected and "
        "no SSH agent holds them; run `ssh-add /k/a /k/b` (on macOS `ssh-add --apple-use-keychain /k/a /k/b`); "
        + tail)
    assert str(sshopen.passphrase_needed("host 'gpu1'", "alice@10.0.0.1:22", ["/k/a"], hop(AGENT_NONE), config)) == (
        "host 'gpu1': SSH login to alice@10.0.0.1:22: the key /k/a is passphrase-protected and IdentityAgent none "
        "for Host gpu1 in /home/me/.ssh/config keeps every SSH agent out; point IdentityAgent at an agent and add it "
        "there (`ssh-add /k/a`); " + tail)
    assert str(sshopen.passphrase_needed("host 'gpu1'", "alice@10.0.0.1:22", ["/k/a"], hop("/run/my agent.sock"),
                                         config)) == (
        "host 'gpu1': SSH login to alice@10.0.0.1:22: the key /k/a is passphrase-protected and the agent at "
        "IdentityAgent /run/my agent.sock does not hold it; run `SSH_AUTH_SOCK='/run/my agent.sock' ssh-add /k/a`; "
        + tail)
    assert str(sshopen.passphrase_needed("host 'gpu1'", "alice@10.0.0.1:22", [], hop(), config)) == (
        "host 'gpu1': SSH login to alice@10.0.0.1:22: the key (~/.ssh/id_*) is passphrase-protected and no SSH agent "
        "holds it; run `ssh-add KEY` (on macOS `ssh-add --apple-use-keychain KEY`); " + tail)


class SigningAgent:
    """An agent on a unix socket holding `key`: it lists it and signs with it (SSH2_AGENTC_REQUEST_IDENTITIES
    and SIGN_REQUEST), for every client, until closed."""

    def __init__(self, path: Path, key: paramiko.PKey) -> None:
        self.key, self.signed = key, 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while request := _read_frame(conn):
                    conn.sendall(_frame(self._answer(paramiko.Message(request))))
            except OSError:
                pass

    def _answer(self, request: paramiko.Message) -> bytes:
        kind = request.get_byte()[0]
        if kind == 11:  # REQUEST_IDENTITIES -> IDENTITIES_ANSWER
            blob = self.key.asbytes()
            return bytes([12]) + struct.pack(">II", 1, len(blob)) + blob + struct.pack(">I", 0)
        if kind == 13:  # SIGN_REQUEST -> SIGN_RESPONSE
            request.get_binary()
            signature = self.key.sign_ssh_data(request.get_binary()).asbytes()
            self.signed += 1
            return bytes([14]) + struct.pack(">I", len(signature)) + signature
        return bytes([5])  # FAILURE

    def __enter__(self) -> SigningAgent:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.close()


def _read_frame(conn: socket.socket) -> bytes:
    head = _read_exactly(conn, 4)
    return _read_exactly(conn, struct.unpack(">I", head)[0]) if head else b""


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body
