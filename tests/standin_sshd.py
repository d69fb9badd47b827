"""A stand-in sshd on loopback, written with paramiko's server side, for hosts that misbehave in
ways a real sshd cannot be told to: it accepts TCP, completes the key exchange with a pinned host
key and logs the test's key in, and then, by `Mode`:

- MUTE: never answers a request to run a command (the server's transport thread waits in
  `check_channel_exec_request`, as a stuck or hostile sshd would: nothing else is answered either);
- SILENT: accepts every command and then sends nothing, ever, and never closes the channel;
- REAL: runs the command with `sh -c` in its home folder, as the uid given (an honest host whose
  login user is not root), stdin, stdout, stderr and exit status carried over the channel — what
  rsync's ssh needs to talk to a real `rsync --server` on the other side.

OpenSSH's client (rsync's `-e ssh`) and the controller's paramiko both log in to it. `stop()`
releases every waiting request and closes every connection.
"""

from __future__ import annotations

import enum
import os
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko


class Mode(enum.Enum):
    MUTE = "mute"
    SILENT = "silent"
    REAL = "real"


@dataclass(frozen=True)
class Keys:
    """The stand-in's host key and the client key it lets in, made with ssh-keygen."""

    host_key: Path
    client_key: Path

    @staticmethod
    def make(folder: Path) -> Keys:
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("host_ed25519", "id_ed25519"):
            if not (folder / name).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True,
                               timeout=30)
        return Keys(folder / "host_ed25519", folder / "id_ed25519")


class _Server(paramiko.ServerInterface):
    def __init__(self, owner: StandinSshd) -> None:
        self.owner = owner

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL if key == self.owner.client_public else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.owner.commands.append(command.decode(errors="replace"))
        if self.owner.mode is Mode.MUTE:
            self.owner.released.wait()
            return False
        if self.owner.mode is Mode.REAL:  # started once this request is answered (`_answer_then_serve`)
            self.owner.to_serve[channel] = command
        return True


class StandinSshd:
    """`with StandinSshd(keys, Mode.MUTE) as sshd:` — listening on 127.0.0.1:`sshd.port`."""

    def __init__(self, keys: Keys, mode: Mode, home: Path | None = None, uid: int | None = None) -> None:
        self.mode = mode
        self.home = home
        self.uid = uid
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(keys.host_key))
        self.client_public = paramiko.Ed25519Key.from_private_key_file(str(keys.client_key))
        self.commands: list[str] = []
        self.to_serve: dict[paramiko.Channel, bytes] = {}  # exec requests not answered yet (ids repeat per connection)
        self.released = threading.Event()
        self.transports: list[paramiko.Transport] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="standin-accept").start()

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def _accept(self) -> None:
        while not self.released.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            transport._channel_handler_table = {**transport._channel_handler_table,
                                                paramiko.common.MSG_CHANNEL_REQUEST: self._answer_then_serve}
            self.transports.append(transport)
            try:
                transport.start_server(server=_Server(self))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    def _answer_then_serve(self, channel: paramiko.Channel, message: paramiko.Message) -> None:
        """paramiko's server answers an exec request after `check_channel_exec_request` returns: a
        command started there could send its output, exit status and close before that answer (a
        quick `echo`), and the client, closed before its request was answered, would raise "Channel
        closed." (a full run saw it). A real sshd answers first; so does this one."""
        paramiko.Channel._handle_request(channel, message)
        command = self.to_serve.pop(channel, None)
        if command is not None:
            threading.Thread(target=self.serve, args=(channel, command), daemon=True).start()

    def serve(self, channel: paramiko.Channel, command: bytes) -> None:
        """REAL mode: the command, as `uid`, with the channel for its stdin, stdout and stderr."""
        home = str(self.home)
        env = {"HOME": home, "PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
        proc = subprocess.Popen(["sh", "-c", command.decode()], cwd=home, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, user=self.uid, group=self.uid,
                                extra_groups=[] if self.uid is not None else None)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        pumps = [threading.Thread(target=_copy_out, args=(proc.stdout, channel.sendall), daemon=True),
                 threading.Thread(target=_copy_out, args=(proc.stderr, channel.sendall_stderr), daemon=True),
                 threading.Thread(target=_copy_in, args=(channel, proc.stdin), daemon=True)]
        for pump in pumps:
            pump.start()
        rc = proc.wait()
        pumps[0].join()
        pumps[1].join()
        try:
            channel.send_exit_status(rc)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def stop(self) -> None:
        self.released.set()
        # Wake the accept() blocked on it first: closed only, its fd number went to the next
        # listener while that call still waited, and it answered there with this one's host key.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for transport in self.transports:
            transport.close()

    def __enter__(self) -> StandinSshd:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _copy_out(source, send) -> None:  # type: ignore[no-untyped-def]
    try:
        while data := source.read1(32768):
            send(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass


def _copy_in(channel: paramiko.Channel, sink) -> None:  # type: ignore[no-untyped-def]
    try:
        while data := channel.recv(32768):
            sink.write(data)
            sink.flush()
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        try:
            sink.close()
        except OSError:
            pass
