"""Commands over an open SSH connection, each with a deadline from the moment it is asked for.

paramiko waits for sshd's answer to "run this" with no limit of its own (`Channel.exec_command`
waits in `_wait_for_event`), and invoke's command timer starts only once that wait is over: a
host whose sshd accepts the connection and then never answers would hold the caller for ever.
Here the channel is opened with a timeout, the exec request is made from a thread the caller
waits for at most EXEC_ANSWER_S (never past its deadline), and the output is read until the
deadline; a channel given up on is closed from a thread of its own (closing can block on a
dead link). What is read is bounded (deploy/edges/capped.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import paramiko

from meshrun.deploy.edges.capped import Capped, read_line
from meshrun.deploy.edges.sshtarget import CONNECT_TIMEOUT_S

SEND_TIMEOUT_S = 10.0  # a host's SSH window with no room this long: the host does not read its stdin
SEND_POLL_S = 0.01

# sshd answers "open a channel" and "run this" at once, before the command does anything: a host
# that has not within this bound is stuck, whatever the command's own time limit.
EXEC_ANSWER_S = CONNECT_TIMEOUT_S
RECV_BYTES = 32768
SshErrors = (OSError, EOFError, paramiko.SSHException)


class Unanswered(Exception):
    """sshd did not answer a request: `what` it was asked (`run`, `open a channel for`), `seconds` waited."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(what)
        self.what, self.seconds = what, seconds


@dataclass(frozen=True)
class Output:
    rc: int  # -1 when the channel closed without an exit status
    stdout: str
    stderr: str


def left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def open_command(transport: paramiko.Transport, command: str, deadline: float,
                 combine_stderr: bool = False) -> paramiko.Channel:
    """A channel running `command`: opened, and the command started, each answered within
    EXEC_ANSWER_S and before `deadline`. Raises Unanswered, or paramiko's errors of a lost link."""
    wait = min(EXEC_ANSWER_S, left(deadline))
    try:
        channel = transport.open_session(timeout=wait)
    except paramiko.SSHException:
        if transport.is_active():  # paramiko's "Timeout opening channel."
            raise Unanswered("open a channel for", wait) from None
        raise
    channel.set_combine_stderr(combine_stderr)
    _exec(channel, command, min(EXEC_ANSWER_S, left(deadline)))
    return channel


def _exec(channel: paramiko.Channel, command: str, wait: float) -> None:
    done = threading.Event()
    failed: list[BaseException] = []

    def ask() -> None:
        try:
            channel.exec_command(command)
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            failed.append(err)
        finally:
            done.set()

    threading.Thread(target=ask, daemon=True, name="ssh-exec").start()
    if not done.wait(wait):
        drop(channel)  # ends the waiting thread too: a closed channel wakes its waiters
        raise Unanswered("run", wait)
    if failed:
        raise failed[0]


def drop(channel: paramiko.Channel) -> None:
    """Close `channel` without waiting for the close to be sent."""
    threading.Thread(target=_close_quietly, args=(channel,), daemon=True, name="ssh-drop").start()


def _close_quietly(channel: paramiko.Channel) -> None:
    """Best effort: the transport may be going away under it (the controller exiting after its
    one-line error, a dead link); a traceback from this thread would follow that line (CI saw one)."""
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - nothing is waiting for this close
        pass


def collect(channel: paramiko.Channel, deadline: float) -> Output | None:
    """The command's stdout, stderr (each capped) and exit status, read at the same time; None
    when the deadline came first (the channel is then dropped)."""
    out, err = Capped(), Capped()
    readers = [_reader(channel.recv, out), _reader(channel.recv_stderr, err)]
    for reader in readers:
        reader.join(left(deadline))
    if any(r.is_alive() for r in readers) or not channel.status_event.wait(left(deadline)):
        drop(channel)
        return None
    rc = channel.recv_exit_status()
    drop(channel)
    return Output(rc, out.text(), err.text())


def _reader(recv: Callable[[int], bytes], sink: Capped) -> threading.Thread:
    def read() -> None:
        try:
            while data := recv(RECV_BYTES):
                sink.feed(data)
        except SshErrors:
            pass

    thread = threading.Thread(target=read, daemon=True, name="ssh-read")
    thread.start()
    return thread


class SshStream:
    """A started command's merged output by line (each line capped), and its stdin."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.out = channel.makefile("rb")
        # The heartbeat thread and the watch loop both send: between one's send_ready() and its
        # send() the other could take the room, and paramiko would then wait for more without end.
        self.sending = threading.Lock()

    def readline(self) -> bytes:
        try:
            return read_line(self.out.readline)
        except SshErrors:
            return b""

    def send(self, data: bytes, timeout: float = SEND_TIMEOUT_S) -> bool:
        """All of `data`, or False: the channel is closed, or the host granted no room in its window
        for `timeout` s (0: only what fits now). Not `sendall`: it waits without end for a host
        that stops reading, and spins once stdin is closed (paramiko's send then returns 0)."""
        view, deadline = memoryview(data), time.monotonic() + timeout
        acquired = self.sending.acquire(timeout=timeout) if timeout > 0 else self.sending.acquire(blocking=False)
        if not acquired:
            return False
        try:
            while view:
                if self.channel.closed or self.channel.eof_sent:
                    return False
                if not self.channel.send_ready():
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(SEND_POLL_S)
                    continue
                sent = self.channel.send(view)
                if sent == 0:
                    return False
                view = view[sent:]
        except SshErrors:
            return False
        finally:
            self.sending.release()
        return True

    def close_stdin(self) -> None:
        try:
            self.channel.shutdown_write()
        except SshErrors:
            pass

    def poll(self) -> int | None:
        return self.channel.recv_exit_status() if self.channel.exit_status_ready() else None

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.channel.status_event.wait(timeout):
            return None
        return self.channel.recv_exit_status()

    def abandon(self) -> None:
        drop(self.channel)
