"""Run a command on a host with data on its stdin: how secrets (the inventory's `env`) reach a
host without ever appearing on a command line (`ps` shows argv to every user of the host) or in
a file."""

from __future__ import annotations

import threading
from typing import Sequence

from meshrun.deploy.edges.transport import CommandResult, Session, Stream
from meshrun.deploy.errors import MeshrunError

# Runs the rest of its argv with the JSON object on the first stdin line added to its
# environment: for commands that cannot read the line themselves (the check's torchrun).
EXEC_WITH_STDIN_ENV = ("import json, os, sys; env = dict(os.environ); env.update(json.loads(sys.stdin.readline())); "
                       "os.execvpe(sys.argv[1], sys.argv[1:], env)")


def collect(stream: Stream, who: str, timeout: float) -> CommandResult:
    """Read a started command to its end (stdout and stderr come merged: both fields hold it)."""
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, b"")), daemon=True)
    reader.start()
    reader.join(timeout)
    rc = None if reader.is_alive() else stream.wait(timeout=5)
    if rc is None:
        stream.abandon()
        raise MeshrunError(f"host '{who}': no answer within {timeout:.0f} s")
    text = b"".join(lines).decode("utf-8", errors="replace")
    return CommandResult(rc, text, text)


def run_fed(session: Session, argv: Sequence[str], data: bytes, timeout: float) -> CommandResult:
    """`session.run` with `data` written to the command's stdin, which is then closed."""
    stream = session.start(argv)
    stream.send(data)
    stream.close_stdin()
    return collect(stream, session.host.name, timeout)
