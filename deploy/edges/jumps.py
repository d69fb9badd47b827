"""ProxyJump hosts shared: every session through the same jump hops rides one connection to them.

Why: each session used to open its own connection to every hop, and the fan-out connects up to 64
hosts at once, so N hosts behind one login node were N SSH handshakes at its sshd in the same
instant. OpenSSH's default `MaxStartups 10:30:100` refuses new connections at random once 10 are
unauthenticated (30 %, rising to all at 100), which paramiko reports as "Error reading SSH protocol
banner": with 30 hosts behind a bastion nearly every task failed. Now the first session that needs a
jump host opens it (one handshake, under its lock: the others wait for it) and every session through
it asks that connection for a direct-tcpip channel to its next hop, as `ssh -J` through a
ControlMaster would. It is closed when the last session that holds it lets go (`take`/`give_back`).
sshd's MaxSessions does not limit it: that counts shells and commands, not forwarded channels.

A handshake that a jump host ends before its banner (EOF or reset: how sshd turns one away past
MaxStartups, e.g. while rsync's own ssh processes start beside the connect, deploy/edges/rsyncrun.py)
is tried again, REFUSED_TRIES in all, after a random pause that doubles: one refused try would
otherwise fail every host behind the jump at once. A try that fails otherwise (a timeout, a key, a
login) is not tried again, and the sessions that waited for it get its error, not a handshake each.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import fabric
import paramiko

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.dial import SaidNothing, dial, said_nothing

# Tries of a handshake refused before its banner, paramiko's and rsync's ssh alike; the pause before
# try k+1 is a random 0.5-1.5 s times 2**(k-1), so the refused ones do not come back together. In a
# simulation of sshd's 10:30:100 rule with clients that each take 2 s to log in, four tries (pauses
# up to 1.5 + 3 + 6 s) left no client failed in 2000 bursts of 30 and 1 burst in 60 of 64 failed;
# three tries failed 1 burst in 7 of 30 (docs/scale.md).
REFUSED_TRIES = 4
REFUSED_PAUSE_S = (0.5, 1.5)


def refused_pause(attempt: int) -> float:
    """Seconds to wait after refused try `attempt` (1-based)."""
    return random.uniform(*REFUSED_PAUSE_S) * 2 ** (attempt - 1)


def refused_early(err: BaseException) -> bool:
    """The server closed or reset the connection before its SSH banner: paramiko's "Error reading SSH
    protocol banner" raised while handling an EOF or a reset (a silent server times out instead)."""
    banner = isinstance(err, paramiko.SSHException) and "protocol banner" in str(err)
    cause = err.__context__ if banner else err
    return isinstance(cause, (EOFError, ConnectionResetError, ConnectionAbortedError))


class HopConnection(fabric.Connection):
    """Fabric's Connection, except that reaching a host through a ProxyJump hop gives up after
    `_channel_timeout`: Fabric asks the hop for the direct-tcpip channel with paramiko's default
    of an hour, and a hop that never answers would hold the connect that long. A hop reached
    directly is dialled by deploy/edges/dial.py (its name resolved within the connect timeout)."""

    _channel_timeout: float = sshtarget.CONNECT_TIMEOUT_S

    def open(self) -> object:
        """Fabric's open over a socket dialled here when no hop comes before this one; a server
        that accepted and never spoke raises SaidNothing (paramiko's own error blamed the session)."""
        if self.is_connected:
            return None
        sock = None if self.gateway else dial(self.host, int(self.port), self.connect_timeout)
        if sock is not None:
            self.connect_kwargs["sock"] = sock
        try:
            return super().open()
        except paramiko.SSHException as err:
            if said_nothing(self.client.get_transport(), err):
                raise SaidNothing(self.connect_timeout) from err
            raise
        finally:
            self.connect_kwargs.pop("sock", None)
            if sock is not None and self.client.get_transport() is None:
                sock.close()  # paramiko failed before taking it: nothing else will close it

    def open_gateway(self) -> paramiko.Channel:
        self.gateway.open()  # a JumpConnection: opened already, or once by whoever holds its lock
        return self.gateway.transport.open_channel("direct-tcpip", (self.host, int(self.port)), ("", 0),
                                                   timeout=self._channel_timeout)


class JumpConnection(HopConnection):
    """A jump host's connection that many sessions share: opened by one caller at a time.
    (Fabric's Connection turns an attribute it does not have into config: hence the class defaults.)"""

    _opening: threading.Lock | None = None
    _tried = 0  # opens that have ended: one that ends while a caller waits answers that caller too
    _failed: Exception | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._opening = threading.Lock()

    def open(self) -> None:
        """Open unless open (Fabric's own `open_gateway` calls this too), with the last timeout set."""
        self.open_within(self._channel_timeout)

    def open_within(self, timeout: float) -> None:
        """Open it within `timeout` s a try unless it is open. A caller that waited while another's
        try failed gets that error (the jump host just said no, or nothing, to the same request)."""
        if self.is_connected:
            return
        seen = self._tried
        assert self._opening is not None
        with self._opening:
            if self.is_connected:
                return
            if self._tried != seen and self._failed is not None:
                raise self._failed
            self._set_timeout(timeout)
            self._failed = None  # a try cut short (Ctrl-C) leaves none: a waiter then tries itself
            try:
                self._open_retrying()
            except Exception as err:
                self._failed = err
                raise
            finally:
                self._tried += 1

    def _set_timeout(self, timeout: float) -> None:
        self.connect_timeout = self._channel_timeout = timeout
        self.connect_kwargs.update(banner_timeout=timeout, auth_timeout=timeout)

    def _open_retrying(self) -> None:
        for attempt in range(1, REFUSED_TRIES + 1):
            try:
                super().open()
                return
            except Exception as err:
                # A failed connect leaves paramiko's reader on the socket, reading the greeting uncapped.
                self.client.close()
                if attempt == REFUSED_TRIES or not refused_early(err):
                    raise
            time.sleep(refused_pause(attempt))


@dataclass
class _Shared:
    conn: JumpConnection
    users: int = 0


_SHARED: dict[Hashable, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def take(key: Hashable, make: Callable[[], JumpConnection]) -> JumpConnection:
    """The connection for `key` (the hops up to this jump, and the known_hosts that pins them),
    made by `make` when no session holds one; held until `give_back(key)`."""
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = _Shared(make())
        shared.users += 1
        return shared.conn


def give_back(key: Hashable) -> None:
    """One holder of `key` lets go; the last one closes the connection."""
    with _SHARED_LOCK:
        shared = _SHARED[key]
        shared.users -= 1
        if shared.users > 0:
            return
        del _SHARED[key]
    shared.conn.client.close()  # outside the lock: closing over a cut link may block
