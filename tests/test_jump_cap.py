"""Hosts behind one ProxyJump host (a login node) must not storm its sshd: OpenSSH's default
`MaxStartups 10:30:100` turns connections away once 10 are logging in, and the controller used to
open one connection to the jump host per target host, all at once (scale review, HIGH).

The jump host here is a stand-in sshd on loopback (paramiko's server side, as tests/standin_sshd.py)
that forwards direct-tcpip channels to a stand-in target, counts the connections it accepts and,
like sshd past MaxStartups, can write "Exceeded MaxStartups" and close a connection before its
banner. The sessions are the controller's real ones (`connect_all`, paramiko, Fabric); rsync is the
real rsync and OpenSSH ssh through that jump host, and a stand-in program, run as a real process,
for the words of each OpenSSH version when it is turned away. No sshd, no network namespace."""

from __future__ import annotations

import shlex
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

import paramiko
import pytest

from meshrun.deploy.edges import jumps, rsyncrun, sshargv, watch
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.sessions import close_all, connect_all
from meshrun.deploy.edges.sshtarget import Hop
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Inventory
from tests.standin_sshd import Keys, Mode, StandinSshd

HOSTS = 30
REFUSED = b"Exceeded MaxStartups\r\n"  # what OpenSSH's sshd writes before it closes one it turns away


class _JumpServer(paramiko.ServerInterface):
    def __init__(self, jump: StandinJump) -> None:
        self.jump = jump

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if key != self.jump.client_public:
            return paramiko.AUTH_FAILED
        self.jump.logged_in()
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple, destination: tuple) -> int:
        self.jump.destinations.append(destination)
        return paramiko.OPEN_SUCCEEDED


class StandinJump:
    """A jump host on 127.0.0.1:`port` forwarding every direct-tcpip channel to `forward_to`.
    `turn_away(n)`: whether to refuse the n-th connection (1-based) as sshd past MaxStartups does;
    `max_startups`: refuse any connection that arrives while that many are logging in."""

    def __init__(self, keys: Keys, forward_to: int, turn_away: Callable[[int], bool] = lambda n: False,
                 max_startups: int | None = None, hold_refusal_s: float = 0.0) -> None:
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(keys.host_key))
        self.client_public = paramiko.Ed25519Key.from_private_key_file(str(keys.client_key))
        self.forward_to, self.turn_away, self.max_startups = forward_to, turn_away, max_startups
        self.hold_refusal_s = hold_refusal_s
        self.accepted = self.refused = self.logging_in = 0
        self.destinations: list[tuple] = []
        self.lock = threading.Lock()
        self.transports: list[paramiko.Transport] = []
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def logged_in(self) -> None:
        with self.lock:
            self.logging_in -= 1

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                refuse = self.turn_away(self.accepted) or (self.max_startups is not None
                                                           and self.logging_in >= self.max_startups)
                self.refused += refuse
                self.logging_in += not refuse
            threading.Thread(target=self._refuse if refuse else self._serve, args=(sock,), daemon=True).start()

    def _refuse(self, sock: socket.socket) -> None:
        time.sleep(self.hold_refusal_s)
        sock.sendall(REFUSED)
        sock.close()

    def _serve(self, sock: socket.socket) -> None:
        transport = paramiko.Transport(sock)
        transport.add_server_key(self.host_key)
        self.transports.append(transport)
        try:
            transport.start_server(server=_JumpServer(self))
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()
            return
        while (channel := transport.accept(timeout=None)) is not None:
            target = socket.create_connection(("127.0.0.1", self.forward_to))
            threading.Thread(target=_pump, args=(channel.recv, target.sendall, target), daemon=True).start()
            threading.Thread(target=_pump, args=(target.recv, channel.sendall, channel), daemon=True).start()

    def stop(self) -> None:
        _end_listener(self.listener)
        for transport in self.transports:
            transport.close()


def _end_listener(listener: socket.socket) -> None:
    """Wake the thread blocked in accept() first: a listener closed under it left it waiting on the
    number, and a restarted accept() then took the connections of a later test's socket that got it."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


def _pump(read: Callable[[int], bytes], write: Callable[[bytes], None], sink: object) -> None:
    try:
        while data := read(32768):
            write(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        try:
            sink.close()  # type: ignore[attr-defined]
        except OSError:
            pass


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def target(keys: Keys) -> Iterator[StandinSshd]:
    """Every host behind the jump host (it forwards each address to this one sshd)."""
    home = Path(tempfile.mkdtemp(prefix="meshrun-jump-home-"))
    (home / "meshrun").mkdir()  # the hosts' workdir, where commands run
    with StandinSshd(keys, Mode.REAL, home=home) as sshd:
        yield sshd
        sshd.released.set()
        _end_listener(sshd.listener)  # before its stop(): see _end_listener
    shutil.rmtree(home)


def behind(jump: StandinJump, target: StandinSshd, keys: Keys, folder: Path,
           monkeypatch: pytest.MonkeyPatch, count: int = HOSTS) -> Inventory:
    """An inventory of `count` hosts 10.99.0.N, each reached through `jump` (ssh_config's ProxyJump),
    with every key pinned."""
    line = target.known_hosts_line().split(" ", 1)[1]
    names = [f"10.99.0.{n}" for n in range(1, count + 1)]
    (folder / "known_hosts").write_text(jump.known_hosts_line() + "".join(f"{a} {line}" for a in names))
    (folder / "ssh_config").write_text(f"Host jump\n  HostName 127.0.0.1\n  Port {jump.port}\n  User meshrun\n"
                                       f"  IdentityFile {keys.client_key}\nHost 10.99.0.*\n  ProxyJump jump\n")
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", str(folder / "ssh_config"))
    hosts = "".join(f"  g{n}:\n    address: {a}\n    identity: {keys.client_key}\n" for n, a in enumerate(names, 1))
    (folder / "hosts.yaml").write_text(f"hosts:\n{hosts}known_hosts: {folder / 'known_hosts'}\n")
    return load_inventory(folder / "hosts.yaml")


def test_thirty_hosts_behind_one_jump_host_reach_it_over_one_connection(
        keys: Keys, target: StandinSshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With sshd's default MaxStartups start (10 logging in), the old controller's 30 connections
    at once were turned away; now the jump host sees one, and all 30 sessions run commands over it.
    The last session closed closes it."""
    jump = StandinJump(keys, target.port, max_startups=10)
    try:
        inventory = behind(jump, target, keys, tmp_path, monkeypatch)
        sessions = connect_all(inventory.hosts, inventory, tmp_path)
        try:
            said = on_each(inventory.hosts, lambda h: sessions[h.name].run(["echo", h.name], timeout=30).stdout,
                           timeout=60).require_all()
        finally:
            close_all(sessions)
        assert (jump.accepted, jump.refused) == (1, 0)
        assert said == {h.name: f"{h.name}\n" for h in inventory.hosts}
        assert sorted(jump.destinations) == sorted((h.address, 22) for h in inventory.hosts)
        assert jumps._SHARED == {}  # given back by every session: closed
        assert _closes(jump.transports[0])
    finally:
        jump.stop()


def _closes(transport: paramiko.Transport, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while transport.is_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not transport.is_active()


def test_a_jump_host_that_turns_the_first_tries_away_is_tried_again(
        keys: Keys, target: StandinSshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jumps, "refused_pause", lambda attempt: 0.05)
    jump = StandinJump(keys, target.port, turn_away=lambda n: n <= jumps.REFUSED_TRIES - 1)
    try:
        inventory = behind(jump, target, keys, tmp_path, monkeypatch, count=3)
        sessions = connect_all(inventory.hosts, inventory, tmp_path)
        close_all(sessions)
        assert (jump.accepted, jump.refused) == (jumps.REFUSED_TRIES, jumps.REFUSED_TRIES - 1)
        assert sorted(sessions) == ["g1", "g2", "g3"]
    finally:
        jump.stop()


def test_a_jump_host_that_always_turns_away_fails_every_host_with_one_line_and_no_storm(
        keys: Keys, target: StandinSshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions that waited for the shared try get its error: REFUSED_TRIES connections in all,
    not that many per host. (The first refusal is held 1 s, so every session is waiting by then.)"""
    monkeypatch.setattr(jumps, "refused_pause", lambda attempt: 0.05)
    jump = StandinJump(keys, target.port, turn_away=lambda n: True, hold_refusal_s=1.0)
    try:
        inventory = behind(jump, target, keys, tmp_path, monkeypatch)
        with pytest.raises(MeshrunError) as raised:
            connect_all(inventory.hosts, inventory, tmp_path)
        assert jump.accepted == jumps.REFUSED_TRIES
        lines = str(raised.value).split("; host ")
        assert len(lines) == HOSTS
        assert f"host 'g7': jump host jump: meshrun@127.0.0.1:{jump.port} closed the SSH connection before its " \
               f"banner, {jumps.REFUSED_TRIES} tries; its sshd refuses new connections while too many are logging " \
               "in (MaxStartups), or it is no sshd: try again, or raise MaxStartups in its sshd_config" \
               in str(raised.value)
        assert jumps._SHARED == {}
    finally:
        jump.stop()


def stand_in_rsync(folder: Path, failures: int, said: str) -> Path:
    """A program in rsync's place that fails `failures` times as rsync does when its ssh says `said`
    (exit 255), then succeeds; each run appends a line to `runs`."""
    program = folder / "stand-in-rsync"
    program.write_text(f"#!/bin/sh\necho run >> {folder}/runs\n"
                       f"if [ $(wc -l < {folder}/runs) -le {failures} ]; then\n"
                       f"  echo '{said}' >&2\n"
                       "  echo 'rsync: connection unexpectedly closed (0 bytes received so far) [sender]' >&2\n"
                       "  exit 255\nfi\nexit 0\n")
    program.chmod(0o755)
    return program


def runs_of(folder: Path) -> int:
    return len((folder / "runs").read_text().splitlines())


@pytest.mark.parametrize("said", ["kex_exchange_identification: Connection closed by remote host",
                                  "kex_exchange_identification: read: Connection reset by peer",
                                  "ssh_exchange_identification: Connection closed by remote host"])
def test_rsync_whose_ssh_is_turned_away_before_the_banner_runs_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str) -> None:
    monkeypatch.setattr(rsyncrun, "refused_pause", lambda attempt: 0.05)
    program = stand_in_rsync(tmp_path, rsyncrun.REFUSED_TRIES - 1, said)
    rsyncrun.run_rsync([str(program)], host="g1", what="code sync", timeout=30, hint="fab check-network")
    assert runs_of(tmp_path) == rsyncrun.REFUSED_TRIES


def test_rsync_turned_away_every_time_fails_after_its_tries_and_other_failures_are_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rsyncrun, "refused_pause", lambda attempt: 0.05)
    program = stand_in_rsync(tmp_path, 99, "kex_exchange_identification: Connection closed by remote host")
    with pytest.raises(MeshrunError, match=r"^host 'g1': code sync failed \(rsync exit 255\): kex_exchange_"):
        rsyncrun.run_rsync([str(program)], host="g1", what="code sync", timeout=30, hint="fab check-network")
    assert runs_of(tmp_path) == rsyncrun.REFUSED_TRIES

    other = tmp_path / "other"
    other.mkdir()
    program = stand_in_rsync(other, 99, "meshrun@10.99.0.1: Permission denied (publickey).")
    with pytest.raises(MeshrunError, match=r"Permission denied \(publickey\)"):
        rsyncrun.run_rsync([str(program)], host="g1", what="code sync", timeout=30, hint="fab check-network")
    assert runs_of(other) == 1


def test_real_rsync_through_a_jump_host_that_turns_its_first_tries_away_gets_through(
        keys: Keys, target: StandinSshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rsync and OpenSSH's ssh as every sync runs them (sshargv: the jump host as a ProxyCommand
    `ssh -W`), the jump host turning the first two away: the third try copies the file."""
    monkeypatch.setattr(rsyncrun, "refused_pause", lambda attempt: 0.05)
    jump = StandinJump(keys, target.port, turn_away=lambda n: n <= 2)
    try:
        known = tmp_path / "known_hosts"
        known.write_text(jump.known_hosts_line() + "10.99.0.1 " + target.known_hosts_line().split(" ", 1)[1])
        key = (str(keys.client_key),)
        ssh = sshargv.hop_argv(Hop("g1", "10.99.0.1", "root", 22, key, "test"),
                               (Hop("jump", "127.0.0.1", "meshrun", jump.port, key, "test"),),
                               sshargv.common_options(known))
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "file").write_text("hello")
        dest = f"jump-cap-{time.monotonic_ns()}"
        rsyncrun.run_rsync(["rsync", "--timeout=30", "--archive", "-e", shlex.join(ssh), f"{tmp_path / 'src'}/",
                            f"10.99.0.1:{dest}/"], host="g1", what="code sync", timeout=60, hint="fab check-network")
        assert (jump.accepted, jump.refused) == (3, 2)
        assert (target.home / dest / "file").read_text() == "hello"  # type: ignore[operator]
    finally:
        jump.stop()


def test_status_watch_asks_on_at_most_its_workers_and_every_host_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view never blocks: it queues a question per idle host; at most WATCH_WORKERS threads ask."""
    monkeypatch.setattr(watch, "WATCH_WORKERS", 4)
    hosts = [type("H", (), {"name": f"g{n}"})() for n in range(1, 21)]
    watcher = watch.RunWatch.__new__(watch.RunWatch)  # its __init__ reads a run record: set what view() uses
    watcher.hosts, watcher.seen, watcher.asking = hosts, {h.name: watch.HostSeen() for h in hosts}, set()
    watcher.waiting, watcher.workers, watcher.lock = deque(), 0, threading.Lock()
    watcher.events_file = Path("/nonexistent/events")
    watcher.record = type("Record", (), {"hosts": tuple(h.name for h in hosts)})()
    asked: list[str] = []
    now, peak = [0], [0]
    gauge, release = threading.Lock(), threading.Event()

    def ask(host: object) -> None:
        with gauge:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        release.wait(30)  # every question hangs until the test lets them go
        with gauge:
            now[0] -= 1
            asked.append(host.name)  # type: ignore[attr-defined]
        with watcher.lock:
            watcher.asking.discard(host.name)  # type: ignore[attr-defined]

    monkeypatch.setattr(watcher, "_ask", ask)
    viewer = threading.Thread(target=watcher.view, daemon=True)
    viewer.start()
    viewer.join(10)
    assert not viewer.is_alive()  # the view returned while every question hung: it did not wait for them
    deadline = time.monotonic() + 10
    while now[0] < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time for a fifth asker, were there one
    assert (now[0], peak[0], asked) == (4, 4, [])
    release.set()
    deadline = time.monotonic() + 10
    while len(asked) < len(hosts) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(asked) == sorted(h.name for h in hosts) and peak[0] == 4
    deadline = time.monotonic() + 5
    while watcher.workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watcher.workers == 0 and not watcher.waiting
