"""Host-side stamp for reusing a passed pre-flight; stdlib only, run as `python -c <this file> [ADDRESS PORT]`.

Prints one line that changes when what the pre-flight checked on this host may have changed:
the boot id (a reboot: new devices, drivers, firewall), the interpreter and its version, and the
modification times of the site-packages folders and of torch's folder (an install, upgrade or
removal rewrites their entries). Finding torch's folder does not import it: this costs tens of
milliseconds where the pre-flight's torch import costs seconds (deploy/run/preflightkey.py).

With ADDRESS and PORT (a host that hosts the run's store: the rendezvous host, and for an elastic
run every successor) also `"rdzv"`: whether the rendezvous port is free right now, "free", "in use"
or "unavailable" (any other bind error). Another run's store there changes the stamp, so a passed
pre-flight is not reused over a busy port (deploy/check/ports.py).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import site
import socket
import sys


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def port_state(address: str, port: int) -> str:
    """Whether torch's store could open `port` here now. The wildcard is bound, as deploy/host/links.py's
    listener does first (the store binds every address: a listener on any one of them holds the port),
    with SO_REUSEADDR as the store sets it (TIME_WAIT is no conflict); never listened on, so nothing can
    connect, and closed at once. A copy of links.py's test: each probe travels alone as `python -c`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    except OSError as err:
        return "in use" if err.errno == errno.EADDRINUSE else "unavailable"
    return "free"


def main(argv: list[str]) -> None:
    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(spec.origin) if spec and spec.origin else ""
    folders = sorted(set(site.getsitepackages() + [site.getusersitepackages()]))
    stamp = {"boot": _boot_id(), "python": os.path.realpath(sys.executable), "version": sys.version,
             "site": [[p, _mtime(p)] for p in folders], "torch": [torch_dir, _mtime(torch_dir) if torch_dir else None]}
    if len(argv) == 2:
        stamp["rdzv"] = port_state(argv[0], int(argv[1]))
    print(json.dumps(stamp, sort_keys=True))


main(sys.argv[1:])
