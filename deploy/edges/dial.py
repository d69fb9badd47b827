"""The TCP connection under an SSH hop, made here rather than by paramiko, and a server that never
speaks told apart from the other ways a connect fails.

Why: paramiko's `SSHClient.connect` resolves the host name with `socket.getaddrinfo` before its
timeout applies, so a slow or dead DNS server held a connect for as long as the resolver liked (45 s
seen, then "is sshd running?"). Here the lookup runs in a daemon thread that the caller waits for at
most the connect timeout, the connect has that timeout too, and paramiko gets the connected socket
(`sock=`): the name and port it checks known_hosts against are still the inventory's.

And: a server that accepts the connection and then says nothing (a host frozen under load, a wedged
sshd) makes paramiko's `start_client(timeout)` return at its timeout without raising; the next step
then fails with "No existing session", which read as "is sshd running?". `said_nothing` tells that
case from a refusal, a babbler or a handshake cut short, by the bytes the socket received.
"""

from __future__ import annotations

import errno
import socket
import threading

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

# A refused or unreachable address is passed over for the next one the name has, as paramiko did;
# any other failure (a timeout) ends the connect.
NEXT_ADDRESS_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH)


class Unresolved(OSError):
    """The name has no address: the resolver said so (`reason`), or did not answer in time."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"cannot resolve {name} ({reason})")
        self.name, self.reason = name, reason


class SaidNothing(paramiko.SSHException):
    """The server accepted the TCP connection and sent not one byte within `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the server sent nothing within {seconds:.0f} s")
        self.seconds = seconds


class Dialled(socket.socket):
    """A TCP socket that counts the bytes received on it: whether the server said anything at all."""

    heard = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        self.heard += len(data)
        return data


def lookup(name: str, port: int, timeout: float) -> list[tuple]:
    """getaddrinfo's answer for `name`, waited for at most `timeout` s (the thread asking is left
    to the resolver: a daemon, it holds nothing). Raises Unresolved."""
    box: list[list[tuple] | BaseException] = []

    def ask() -> None:
        try:
            box.append(socket.getaddrinfo(name, port, socket.AF_UNSPEC, socket.SOCK_STREAM))
        except (OSError, UnicodeError) as err:  # gaierror; a name IDNA cannot encode
            box.append(err)

    thread = threading.Thread(target=ask, daemon=True, name="ssh-lookup")
    thread.start()
    thread.join(timeout)
    if not box:
        raise Unresolved(name, f"no answer from the resolver within {timeout:.0f} s")
    found = box[0]
    if isinstance(found, BaseException):
        raise Unresolved(name, getattr(found, "strerror", None) or str(found))
    if not found:
        raise Unresolved(name, "no address")
    return found


def dial(name: str, port: int, timeout: float) -> Dialled:
    """A TCP connection to `name`:`port`, the lookup and the connect each within `timeout` s.
    Raises Unresolved, socket.timeout, NoValidConnectionsError (every address refused or
    unreachable) or the OSError of the first address that failed otherwise."""
    errors: dict[tuple, OSError] = {}
    for family, _kind, proto, _canon, address in lookup(name, port, timeout):
        sock = Dialled(family, socket.SOCK_STREAM, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            return sock
        except OSError as err:
            sock.close()
            if err.errno not in NEXT_ADDRESS_ERRNOS:
                raise
            errors[address] = err
    raise NoValidConnectionsError(errors)


def heard_nothing(transport: paramiko.Transport | None) -> bool:
    """The server at the other end of `transport` has sent not one byte: no banner, no key exchange.
    Behind a jump host the socket is a channel, whose bytes are not counted: only the banner is."""
    if transport is None or transport.initial_kex_done or transport.remote_version:
        return False
    return not getattr(transport.sock, "heard", 0)


def said_nothing(transport: paramiko.Transport | None, err: BaseException) -> bool:
    """The handshake that raised `err` failed because the server never spoke by the time paramiko
    gave up: its start_client returned at the timeout ("No existing session" follows), or its reader
    gave up on the banner first. A close or reset before the banner (sshd past MaxStartups,
    jumps.refused_early) is not this, nor a server that sent bytes that are not SSH."""
    if not heard_nothing(transport):
        return False
    text = str(err)
    if "No existing session" in text:
        return True
    return "protocol banner" in text and isinstance(err.__context__, TimeoutError)
