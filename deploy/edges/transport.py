"""The edge that runs commands on hosts: local subprocesses for `address: local`, SSH otherwise.

Both kinds take an argv. For SSH it is quoted into one string by `deploy.run.shell`; locally it
goes to subprocess as is. Connection failures become one-line MeshrunErrors naming the host.
Every command has a deadline from the moment it is asked for, the SSH request that starts it
included, and a host that stops answering SSH while it runs is given up on within tens of seconds
(deploy/edges/sshexec.py); what it prints is capped (deploy/edges/capped.py). Each hop is opened,
and its failures said, by deploy/edges/sshopen.py, over a socket deploy/edges/dial.py connects.
"""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import paramiko

from meshrun.deploy.edges import hostkeys, jumps, sshtarget
from meshrun.deploy.edges.capped import Capped, read_line
from meshrun.deploy.edges.jumps import HopConnection, JumpConnection
from meshrun.deploy.edges.localproc import run_bounded
from meshrun.deploy.edges.sshexec import (PING_TIMEOUT_S, Lost, SshErrors, SshStream, Unanswered, asked, drop,
                                          collect, NotFinished, not_finished, open_command, stopped_answering)
from meshrun.deploy.edges.sshopen import Opening, connection, offered_key, open_hop, reach, unsendable
# Still importable from here (tests do): they moved to sshopen.py with the rest of a hop's opening.
from meshrun.deploy.edges.sshopen import TRANSPORT_POLL_S, login_refused  # noqa: F401
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.shell import local_workdir, remote_command

DEFAULT_CONNECT_TIMEOUT_S = sshtarget.CONNECT_TIMEOUT_S


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def last_json(self) -> Any:
        """The JSON document on the last line of stdout (host probes print their answer last)."""
        return last_json_line(self.stdout)


def last_json_line(text: str) -> Any:
    """Parse the last non-empty line as JSON; ValueError when there is none or it is not JSON."""
    lines = text.strip().splitlines()
    if not lines:
        raise ValueError("no output")
    try:
        return json.loads(lines[-1])
    except RecursionError:  # `[[[[…` from a host: data nested too deep to be an answer
        raise ValueError("JSON nested too deep") from None


class Stream(Protocol):
    """A long-running command: merged output by line, a stdin to write heartbeats to."""

    def readline(self) -> bytes: ...  # b"" at EOF
    def send(self, data: bytes, timeout: float = ...) -> bool: ...  # False: the other end is gone or reads nothing
    def close_stdin(self) -> None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int | None: ...
    def abandon(self) -> None: ...  # drop the connection without waiting


class Session(Protocol):
    host: Host

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult: ...
    def start(self, argv: Sequence[str]) -> Stream: ...
    def ping(self, timeout: float) -> bool: ...  # the host answers a trivial command in time
    def close(self) -> None: ...


class LocalStream:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def readline(self) -> bytes:
        assert self.proc.stdout is not None
        return read_line(self.proc.stdout.readline)

    def send(self, data: bytes, timeout: float = 0.0) -> bool:
        """A local agent (this machine's own): a pipe write, which its reader drains."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def close_stdin(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def abandon(self) -> None:
        self.close_stdin()


def local_host_refusal(name: str, system: str) -> str | None:
    """Why host `name`, `address: local`, cannot run on a controller whose `platform.system()` is
    `system`, or None. A local host runs meshrun's host agent and torchrun here, and they are Linux
    programs: processes found in /proc, torchrun and its workers tied to their parent by prctl
    (deploy/host/procs.py, torchrun.py). On macOS the agent would die with a traceback before
    torchrun starts, and `fab status`/`fab stop` could not find the run."""
    if system == "Linux":
        return None
    return (f"host '{name}': `address: local` runs meshrun's host agent on this machine, which needs Linux "
            f"(/proc, prctl); this machine is {system or 'not Linux'}: train on a Linux host (a VM or a remote box) "
            "instead")


class LocalSession:
    """`address: local`: the host is this machine; its workdir is resolved against the project.
    Every local host's command passes here, so a machine that cannot be one is refused here, once
    (`local_host_refusal`); `system` is `platform.system()` unless a test names another."""

    def __init__(self, host: Host, project_root: Path, system: str | None = None) -> None:
        refusal = local_host_refusal(host.name, platform.system() if system is None else system)
        if refusal is not None:
            raise MeshrunError(refusal)
        self.host = host
        self.cwd = local_workdir(host.workdir, project_root)

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        if create_workdir:
            self.cwd.mkdir(parents=True, exist_ok=True)
        out, err = Capped(), Capped()
        try:
            rc = run_bounded(argv, timeout=timeout, on_stdout=out.feed, on_stderr=err.feed, cwd=self.cwd)
        except OSError as error:
            return CommandResult(127, "", f"{argv[0]}: {error.strerror}")
        if rc is None:
            raise NotFinished(f"host '{self.host.name}': {asked(argv)} did not finish within {timeout:.0f} s: this "
                              "machine may be overloaded or its disk (NFS?) hung")
        return CommandResult(rc, out.text(), err.text())

    def start(self, argv: Sequence[str]) -> LocalStream:
        proc = subprocess.Popen(list(argv), cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        return LocalStream(proc)

    def ping(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


class SshSession:
    """An SSH connection with enforced host keys (see deploy.edges.hostkeys) on every hop: each
    ProxyJump host is opened, checked, and carries the next hop's connection. A jump host's
    connection is shared by every session of this process through the same hops (deploy/edges/
    jumps.py): N hosts behind a login node are one handshake there, not N at once."""

    def __init__(self, host: Host, known_hosts: Path | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.host = host
        self.known_hosts = known_hosts
        self.timeout = connect_timeout
        self.target = sshtarget.resolve(host)
        self.conn = connection(self.target.target, None, known_hosts, connect_timeout)
        self.chain: list[HopConnection] = [self.conn]
        self._held: list[tuple[Path | None, tuple[sshtarget.Hop, ...]]] = []  # keys of the jumps taken
        self._hold()

    def _hold(self) -> None:
        """Take the shared connections to this host's jump hosts (again after a close or a failed open)."""
        if self._held or not self.target.jumps:
            return
        chain: list[HopConnection] = []
        for count, hop in enumerate(self.target.jumps, 1):
            key = (self.known_hosts, self.target.jumps[:count])
            gateway = chain[-1] if chain else None
            chain.append(jumps.take(key, functools.partial(connection, hop, gateway, self.known_hosts, self.timeout,
                                                           JumpConnection)))
            self._held.append(key)
        self.conn.gateway = chain[-1]
        self.chain = [*chain, self.conn]

    def _release(self) -> None:
        while self._held:  # pop: a close from two threads gives each jump back once
            jumps.give_back(self._held.pop())

    def open(self) -> SshSession:
        return self.open_hops(len(self.chain))

    def open_hops(self, count: int) -> SshSession:
        """Open the first `count` hops in order (all of them: the target too)."""
        try:
            sshtarget.check_keys(self.target, count)
            self._hold()
            for index, (hop, conn) in enumerate(zip(self.target.hops[:count], self.chain)):
                self._open(conn, hop, hop.label if index < len(self.target.jumps) else None)
        except BaseException:
            self._drop()
            raise
        return self

    def _drop(self) -> None:
        """After a failed connect: Fabric's close() does nothing until a connect has returned, and
        paramiko's reader would go on reading the host's greeting (uncapped) on its socket. A jump
        host's failed connect frees itself (jumps.py); one that is open is given back."""
        try:
            self.conn.client.close()
        except Exception:  # noqa: BLE001 - the connect has already failed; this only frees it
            pass
        self._release()

    def _open(self, conn: HopConnection, hop: sshtarget.Hop, jump: str | None) -> None:
        open_hop(conn, hop, jump, Opening(self.host.name, self.known_hosts, self.target.config, self.timeout))

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        """`argv` run on the host, all of it within `timeout` s from now: the request to start it
        answered (at most EXEC_ANSWER_S), its output read (capped) and its exit status. A host that
        stops answering SSH meanwhile is given up on within tens of seconds (sshexec.Liveness), and
        one past the deadline is pinged once (PING_TIMEOUT_S more) to say which of the two it is."""
        begun = time.monotonic()
        channel = self._command(argv, remote_command(self.host.workdir, argv, create_workdir=create_workdir),
                                begun + timeout)
        try:
            channel.shutdown_write()  # nothing is fed to it: a command that reads stdin sees EOF
        except SshErrors as err:
            raise self._lost(err) from None
        try:
            output = collect(channel, begun + timeout, alive=self.ping)
        except Lost:
            self._forget()
            raise stopped_answering(self.host.name, argv, time.monotonic() - begun) from None
        if output is None:
            if not self.ping(PING_TIMEOUT_S):
                self._forget()
                raise stopped_answering(self.host.name, argv, timeout)
            raise not_finished(self.host.name, argv, timeout)
        return CommandResult(output.rc, output.stdout, output.stderr)

    def _forget(self) -> None:
        """Close a connection the host stopped answering on, from a thread (the close may block on the
        cut link): the next command connects again rather than wait on a channel nobody will grant."""
        transport = self.conn.client.get_transport()
        if transport is not None:
            threading.Thread(target=transport.close, daemon=True, name="ssh-forget").start()

    def start(self, argv: Sequence[str]) -> SshStream:
        """`argv` started on the host (stderr merged into stdout); the start is answered within
        the session's connect timeout or it is a MeshrunError."""
        channel = self._command(argv, remote_command(self.host.workdir, argv), time.monotonic() + self.timeout,
                                combine_stderr=True)
        return SshStream(channel)

    def _command(self, argv: Sequence[str], command: str, deadline: float,
                 combine_stderr: bool = False) -> paramiko.Channel:
        try:
            command.encode("utf-8")  # as paramiko will, before a channel is opened: a refused one leaks none
            if not self.conn.is_connected:  # dropped: connect again, as Fabric's own run did
                self.open()
            transport = self.conn.client.get_transport()
            assert transport is not None
            return open_command(transport, command, deadline, combine_stderr)
        except Unanswered as err:
            raise MeshrunError(f"host '{self.host.name}': its sshd accepted the connection but did not answer the "
                               f"request to {err.what} `{argv[0]}` within {err.seconds:.0f} s; is the host overloaded "
                               f"or its sshd stuck? (fab check-network --hosts {self.host.name})") from None
        except SshErrors as err:
            raise self._lost(err) from None
        except ValueError as err:  # UnicodeEncodeError: that check's, or paramiko's own
            raise unsendable(self.host.name, argv, err) from None

    def _lost(self, err: BaseException) -> MeshrunError:
        return MeshrunError(f"host '{self.host.name}': SSH connection lost ({err.__class__.__name__}: {err}); "
                            f"is it up? (fab check-network --hosts {self.host.name})")

    def ping(self, timeout: float) -> bool:
        """The host's sshd grants a new channel within `timeout`: the link and sshd are alive. The
        channel is closed unused: asking it to run `true` made sshd fork a shell for every probe,
        every 2 s on every host of a run (4 ms of CPU each on the test bed, docs/scale.md); paramiko's
        record of it is forgotten once enough newer channels closed (`sshexec.forget_old_channels`)."""
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            return False
        try:
            channel = transport.open_session(timeout=timeout)
        except SshErrors:
            return False
        drop(channel)
        return True

    def close(self) -> None:
        self.conn.close()
        self._release()  # the last session through a jump host closes it


def connect(host: Host, known_hosts: Path | None, project_root: Path,
            timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> LocalSession | SshSession:
    """An open session to `host`, or a MeshrunError that says what is wrong."""
    if host.is_local:
        return LocalSession(host, project_root)
    return SshSession(host, known_hosts, timeout).open()


def scan_host_key(host: Host, known_hosts: Path | None, hop: int | None = None,
                  timeout: float = DEFAULT_CONNECT_TIMEOUT_S, preferred: Sequence[str] = ()) -> paramiko.PKey:
    """The host key the sshd of hop `hop` (default: the target) of `host`'s chain offers, fetched
    without logging in to it (for `fab trust`); the hops before it are opened with pinned keys.
    `preferred`: key types to ask for first (those already known for the host)."""
    session = SshSession(host, known_hosts, timeout)
    index = len(session.chain) - 1 if hop is None else hop
    dest = session.target.hops[index]
    who = hostkeys.whose(host.name, dest.label if index < len(session.target.jumps) else None)
    try:
        session.open_hops(index)
        sock = reach(session.chain[index - 1] if index else None, dest, who, timeout)
        return offered_key(sock, who, f"{dest.hostname}:{dest.port}", timeout, preferred)
    finally:
        session.close()
