"""Run a command on a host with data on its stdin: how secrets (the inventory's `env`) reach a
host without ever appearing on a command line (`ps` shows argv to every user of the host) or in
a file."""

from __future__ import annotations

import threading
import time
from typing import Sequence

from meshrun.deploy.edges.capped import Capped
from meshrun.deploy.edges.transport import CommandResult, Session, Stream
from meshrun.deploy.errors import MeshrunError

# Runs the rest of its argv with the JSON object on the first stdin line added to its
# environment: for commands that cannot read the line themselves (the check's torchrun). A word
# starting `~/` is under the host user's home, as the shell expands only the first word it is
# sent (deploy/run/shell.py): the inventory's `python: ~/…` is also torchrun's program, further on.
EXEC_WITH_STDIN_ENV = ("import json, os, sys; env = dict(os.environ); env.update(json.loads(sys.stdin.readline())); "
                       "argv = [os.path.expanduser(a) if a.startswith('~/') else a for a in sys.argv[1:]]; "
                       "os.execvpe(argv[0], argv, env)")


def collect(stream: Stream, who: str, timeout: float) -> CommandResult:
    """Read a started command to its end, within `timeout` s (stdout and stderr come merged: both
    fields hold it, capped like every answer)."""
    out = Capped()

    def read() -> None:
        while line := stream.readline():
            out.feed(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    rc = None if reader.is_alive() else stream.wait(timeout=5)
    if rc is None:
        stream.abandon()
        raise MeshrunError(f"host '{who}': no answer within {timeout:.0f} s")
    text = out.text()
    return CommandResult(rc, text, text)


def run_fed(session: Session, argv: Sequence[str], data: bytes, timeout: float) -> CommandResult:
    """`session.run` with `data` written to the command's stdin, which is then closed; all of it
    within `timeout` s from now (the start included)."""
    deadline = time.monotonic() + timeout
    stream = session.start(argv)
    stream.send(data)
    stream.close_stdin()
    return collect(stream, session.host.name, max(0.0, deadline - time.monotonic()))


def first_line(stream: Stream, who: str, what: str, timeout: float) -> bytes:
    """The first line a started command prints, within `timeout` s; else the stream is abandoned
    and the error names the host and what it did not say."""
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        stream.abandon()
        raise MeshrunError(f"host '{who}': {what} printed nothing within {timeout:.0f} s")
    return box[0]
