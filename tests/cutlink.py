"""A link that can be cut without a reset, for in-process SSH tests (tests/test_ssh_liveness.py,
tests/test_logs_follow_gone.py): the bytes stop, and neither side hears of it, as when a laptop
sleeps or a NAT forgets the connection."""

from __future__ import annotations

import socket
import threading

import paramiko


class Link:
    """Two socket pairs joined by pumps: the client's end, the server's end, and `cut`."""

    def __init__(self) -> None:
        self.cut = threading.Event()
        self.client, near = socket.socketpair()
        far, self.server = socket.socketpair()
        for a, b in ((near, far), (far, near)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if not self.cut.is_set():  # cut: the bytes vanish and no side hears of it
                    b.sendall(data)
        except OSError:
            pass


def joined(link: Link, server: paramiko.ServerInterface, host_key: str) -> tuple[paramiko.Transport, paramiko.Transport]:
    """An in-process SSH server (`server`, with `host_key`) at the link's far end and a client at its
    near end, logged in as root: (client, served)."""
    served = paramiko.Transport(link.server)
    served.add_server_key(paramiko.Ed25519Key.from_private_key_file(host_key))
    served.start_server(event=threading.Event(), server=server)
    client = paramiko.Transport(link.client)
    client.start_client(timeout=10)
    client.auth_none("root")
    return client, served
