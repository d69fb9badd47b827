"""Commands over an open SSH connection, each with a deadline from the moment it is asked for.

paramiko waits for sshd's answer to "run this" with no limit of its own (`Channel.exec_command`
waits in `_wait_for_event`), and invoke's command timer starts only once that wait is over: a
host whose sshd accepts the connection and then never answers would hold the caller for ever.
Here the channel is opened with a timeout, the exec request is made from a thread the caller
waits for at most EXEC_ANSWER_S (never past its deadline), and the output is read until the
deadline; a channel given up on is closed from a thread of its own (closing can block on a
dead link). What is read is bounded (deploy/edges/capped.py).

A link that dies without a reset (a VPN flap, a host powered off) shows as nothing at all: a command
would wait out its deadline, an hour for `fab setup`. So a command that stays quiet has its host
pinged (`Liveness`), and a host that stops answering ends it within tens of seconds (`Lost`).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable, Sequence

import paramiko

from meshrun.deploy.edges.capped import Capped, read_line
from meshrun.deploy.edges.sshtarget import CONNECT_TIMEOUT_S
from meshrun.deploy.errors import MeshrunError

SEND_TIMEOUT_S = 10.0  # a host's SSH window with no room this long: the host does not read its stdin
SEND_POLL_S = 0.01

# sshd answers "open a channel" and "run this" at once, before the command does anything: a host
# that has not within this bound is stuck, whatever the command's own time limit.
EXEC_ANSWER_S = CONNECT_TIMEOUT_S
RECV_BYTES = 32768
# A command quiet this long (no output) has its host pinged: only then, so the many short commands
# cost no extra round trip, and one that prints as it goes (pip) none at all.
QUIET_BEFORE_PING_S = 12.0
# sshd granting a new channel: a round trip. Not the launcher's 6 s (launcher.py), which was raised for a
# training run whose all-reduce keeps both links' queues full; a quiet command's link carries little,
# and a host counts as lost only after PINGS_BEFORE_LOST misses in a row (9 s with no channel granted).
# Kept at 3 s until a ping here is seen to miss that often on a healthy host (an upload beside it):
# then 6 s, noticed within 12 + 3 * 6 = 30 s. Also how long a command past its deadline is pinged.
PING_TIMEOUT_S = 3.0
# Misses in a row before the host counts as gone: one more than the launcher's, as a long command
# (a torch install) may load the host; a cut link is then noticed within about 12 + 3 * 3 = 21 s.
PINGS_BEFORE_LOST = 3
# Closed channels whose late messages paramiko still recognises per connection (forget_old_channels).
KEEP_CLOSED_CHANNELS = 256
WAIT_STEP_S = 1.0  # how often a waiting `collect` looks at the clock and the host's liveness
WORD_MAX = 64  # characters of one word of a command shown in a message
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
    """Close `channel` without waiting for the close to be sent (closing can block on a dead link),
    then bound what its transport remembers of closed channels (`forget_old_channels`)."""
    threading.Thread(target=_close_quietly, args=(channel,), daemon=True, name="ssh-drop").start()


def _close_quietly(channel: paramiko.Channel) -> None:
    """Best effort: the transport may be going away under it (the controller exiting after its
    one-line error, a dead link); a traceback from this thread would follow that line (CI saw one)."""
    try:
        channel.close()
        forget_old_channels(channel.get_transport())
    except Exception:  # noqa: BLE001 - nothing is waiting for this close
        pass


def forget_old_channels(transport: paramiko.Transport) -> None:
    """Remove the oldest closed channels' ids from `transport.channels_seen` once it holds more than
    2 * KEEP_CLOSED_CHANNELS of them, down to KEEP_CLOSED_CHANNELS.

    paramiko adds every channel it opens to that dict and never removes it: a liveness probe every 2 s
    per host and every command of a run's polls, for a week, kept ~70 MB at 3 hosts (review longrun56,
    finding 3). Its reader looks an id up there only for a message naming a channel it no longer has:
    found, the message is ignored; not found, paramiko ends the whole connection. A host may send on a
    channel after we closed it (paramiko's own server sends a command's exit status after the close
    when the client gave up first; the close itself comes after ours), so the newest closed ids are
    kept: a message that late, KEEP_CLOSED_CHANNELS channels on, is not one a working sshd sends.
    Oldest first is the dict's order (ids are handed out in increasing order, reused only after
    2**24); the transport's lock is the one paramiko holds while it opens a channel and records its id."""
    keep = KEEP_CLOSED_CHANNELS
    live, seen = getattr(transport, "_channels", None), getattr(transport, "channels_seen", None)
    if live is None or not isinstance(seen, dict) or len(seen) <= 2 * keep:  # another paramiko: leave it
        return
    with transport.lock:
        closed = [chanid for chanid in seen if live.get(chanid) is None]
        for chanid in closed[:max(0, len(closed) - keep)]:
            del seen[chanid]


class Lost(Exception):
    """The host stopped answering SSH while a command ran: PINGS_BEFORE_LOST pings in a row unanswered."""


@dataclass
class Liveness:
    """Whether the host still answers while a command says nothing: `alive(timeout)` (the session's
    ping: a channel granted and closed unused, no shell forked) once the command has been quiet for
    QUIET_BEFORE_PING_S, then again each time it is quiet that long since the last answer. A short
    command, or one that prints as it goes, is never pinged."""

    alive: Callable[[float], bool] | None
    heard: float = field(default_factory=time.monotonic)  # the last byte of output or answered ping
    missed: int = 0

    def heard_now(self) -> None:
        self.heard = time.monotonic()

    def check(self, deadline: float) -> None:
        """Ping if the command has been quiet long enough; raise Lost after PINGS_BEFORE_LOST misses."""
        wait = min(PING_TIMEOUT_S, left(deadline))
        if self.alive is None or time.monotonic() - self.heard < QUIET_BEFORE_PING_S or wait <= 0:
            return
        if self.alive(wait):
            self.missed = 0
            self.heard_now()
            return
        self.missed += 1
        if self.missed >= PINGS_BEFORE_LOST:
            raise Lost()


def collect(channel: paramiko.Channel, deadline: float,
            alive: Callable[[float], bool] | None = None) -> Output | None:
    """The command's stdout, stderr (each capped) and exit status, read at the same time; None
    when the deadline came first. With `alive` (the session's ping) a host that stops answering
    raises Lost within about QUIET_BEFORE_PING_S + PINGS_BEFORE_LOST * PING_TIMEOUT_S of its last
    word, not at the deadline (an hour for `fab setup`). The channel is dropped either way."""
    out, err = Capped(), Capped()
    liveness = Liveness(alive)
    readers = [_reader(channel.recv, out, liveness), _reader(channel.recv_stderr, err, liveness)]
    try:
        finished = _finished(readers, channel, deadline, liveness)
    except Lost:
        drop(channel)
        raise
    if not finished:
        drop(channel)
        return None
    rc = channel.recv_exit_status()
    drop(channel)
    return Output(rc, out.text(), err.text())


def _finished(readers: list[threading.Thread], channel: paramiko.Channel, deadline: float,
              liveness: Liveness) -> bool:
    """Both readers at EOF and the exit status in, before `deadline`; the host's liveness checked
    between waits of at most WAIT_STEP_S."""
    while True:
        busy = next((r for r in readers if r.is_alive()), None)
        step = min(WAIT_STEP_S, left(deadline))
        if busy is not None:
            busy.join(step)
        elif channel.status_event.wait(step):
            return True
        if left(deadline) <= 0:
            return not any(r.is_alive() for r in readers) and channel.status_event.is_set()
        liveness.check(deadline)


def _reader(recv: Callable[[int], bytes], sink: Capped, liveness: Liveness) -> threading.Thread:
    def read() -> None:
        try:
            while data := recv(RECV_BYTES):
                sink.feed(data)
                liveness.heard_now()
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


def asked(argv: Sequence[str]) -> str:
    """What a command was asked to do, in a few words for a message: the program's name (not its
    path: argv[0] is often an interpreter's) and what tells this command from others: a `-m` module
    and its verb, a `-c` script by its title (the first phrase of its docstring) or its size, else
    the first argument. Each word is clipped and made printable."""
    program, rest = PurePosixPath(argv[0]).name or argv[0], list(argv[1:])
    words = [program]
    flags = 0
    while flags < len(rest) and rest[flags] in ("-I", "-S", "-u", "-B", "-E", "-s"):
        flags += 1
    if rest[flags:flags + 1] == ["-m"] and len(rest) > flags + 1:
        words += [*rest[:flags], "-m", rest[flags + 1], *_verb(rest[flags + 2:])]
    elif rest[flags:flags + 1] == ["-c"] and len(rest) > flags + 1:
        words += [*rest[:flags], "-c", f"<{_title(rest[flags + 1])}>", *rest[flags + 2:flags + 3]]
    else:
        words += rest[:1]
    return "`" + " ".join(_word(w) for w in words) + "`"


def _verb(rest: list[str]) -> list[str]:
    return rest[:1] if rest and not rest[0].startswith("-") else []


def _title(script: str) -> str:
    """The first phrase of the script's docstring or comment (`Host-side fact probe for fab check-network`
    of deploy/host/facts.py), else its size in lines."""
    lines = [line.strip() for line in script.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.startswith(('"""', "'''", "#")):
        text = first.lstrip("#").strip().strip("\"'").strip()
        title = re.split(r"[;:,]\s|\.(?:\s|$)", text, maxsplit=1)[0].replace("`", "").strip()
        if title:
            return title
    return f"a {len(lines)}-line script"


def _word(text: str) -> str:
    shown = text if text.isprintable() else repr(text)[1:-1]
    return shown if len(shown) <= WORD_MAX else shown[:WORD_MAX - 1] + "…"


class NotFinished(MeshrunError):
    """A command past its deadline on a host whose sshd still answers: `fab status` can tell it from
    an unreachable host by its type."""


class StoppedAnswering(MeshrunError):
    """The host stopped answering SSH while a command ran: its link is cut or it is frozen."""


def not_finished(host: str, argv: Sequence[str], seconds: float) -> NotFinished:
    """The command ran past its deadline and the host's sshd still answers: the command itself hangs."""
    return NotFinished(f"host '{host}': {asked(argv)} did not finish within {seconds:.0f} s though SSH answers: the "
                        f"host may be overloaded or its disk (NFS?) hung; fab check-network --hosts {host}")


def stopped_answering(host: str, argv: Sequence[str], seconds: float) -> StoppedAnswering:
    """The host stopped answering SSH `seconds` into the command: its link is cut or it is frozen."""
    return StoppedAnswering(f"host '{host}': stopped answering SSH {seconds:.0f} s into {asked(argv)} (link cut or "
                        f"host frozen); fab check-network --hosts {host}")
