"""A host that answers every command with a crafted text, for the tests of the controller's
parsing of host answers (tests/test_hostile_answers.py, tests/test_hostile_probe_answers.py).
A fake session stands in for SSH because what is under test is the controller's reading of the
answer, not the transport: the transport is tested on real sshd elsewhere."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network

DEEP = "[" * 100_000  # json.loads raises RecursionError, not ValueError


def host(network: Network = Network.LAN, ssh_address: str | None = None) -> Host:
    return Host("h1", "10.147.17.5", ssh_address=ssh_address, user="root", port=22, identity=None,
                python="/venv/bin/python", workdir="~/meshrun", network=network, gpus=None, nproc=None,
                batch_size=None, env=())


class FakeStream:
    """A started command that prints `text` and exits with `rc`."""

    def __init__(self, text: str, rc: int) -> None:
        self.lines, self.rc = [line.encode() for line in text.splitlines(keepends=True)], rc
        self.abandoned = self.closed = False

    def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""

    def send(self, data: bytes, timeout: float = 0.0) -> bool:
        return True

    def close_stdin(self) -> None:
        self.closed = True

    def poll(self) -> int | None:
        return self.rc

    def wait(self, timeout: float | None = None) -> int | None:
        return self.rc

    def abandon(self) -> None:
        self.abandoned = True


class FakeSession:
    """A host that answers every command with `stdout` (or `stdout(argv)`), the answer under test."""

    def __init__(self, stdout: str | Callable[[Sequence[str]], str], rc: int = 0, the_host: Host | None = None) -> None:
        self.host, self.stdout, self.rc = the_host or host(), stdout, rc
        self.streams: list[FakeStream] = []

    def _text(self, argv: Sequence[str]) -> str:
        return self.stdout(argv) if callable(self.stdout) else self.stdout

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        return CommandResult(self.rc, self._text(argv), "")

    def start(self, argv: Sequence[str]) -> FakeStream:
        self.streams.append(FakeStream(self._text(argv), self.rc))
        return self.streams[-1]

    def ping(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


def failure(call: Callable[[], object]) -> str:
    with pytest.raises(MeshrunError) as err:
        call()
    return str(err.value)


class HostFiles:
    """A host whose workdir is a folder here: each command runs there for real (`tail` reads the files),
    each asked recorded in `asked` as (host, argv)."""

    def __init__(self, name: str, workdir: Path, asked: list[tuple[str, list[str]]]) -> None:
        self.host: Host = dataclasses.replace(host(), name=name)
        self.workdir, self.asked = workdir, asked
        workdir.mkdir(parents=True, exist_ok=True)

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        self.asked.append((self.host.name, list(argv)))
        done = subprocess.run(list(argv), cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr)
