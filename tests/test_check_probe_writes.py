"""check-network's all-reduce fails, naming the host, the folder and the error, when a host cannot
write the probe's files, before any torchrun starts (findings "stalls", 8): the writes' results were
thrown away, and the all-reduce then failed as "python3: can't open file '…/meshrun_torchrun.py'",
the real cause (a full disk, a read-only workdir, a hung NFS write) lost.

A fake session stands in for SSH: what is under test is what the check does with the answers."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import pytest

from meshrun.deploy.check.verdicts import AllReduceBudget, AllReduceResult, ProbeStatus
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from tests.fakesession import host

FULL = "OSError: [Errno 28] No space left on device"


class WritingHost:
    """A host whose writes answer `write` (a CommandResult, or a MeshrunError raised); starting a
    command (torchrun) there fails the test."""

    def __init__(self, the_host: Host, write: CommandResult | MeshrunError) -> None:
        self.host, self.write, self.writes = the_host, write, 0

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        assert argv[1:3] == ["-c", check_probes.WRITE_FILE], argv
        self.writes += 1
        if isinstance(self.write, MeshrunError):
            raise self.write
        return self.write

    def start(self, argv: Sequence[str]) -> object:
        raise AssertionError(f"{self.host.name}: torchrun started after a failed write: {argv}")


def hosts() -> tuple[Host, Host]:
    return (dataclasses.replace(host(), name="h1"), dataclasses.replace(host(), name="h2", address="10.147.17.6"))


def allreduce(h2_write: CommandResult | MeshrunError) -> tuple[AllReduceResult, dict[str, WritingHost]]:
    h1, h2 = hosts()
    sessions = {"h1": WritingHost(h1, CommandResult(0, "", "")), "h2": WritingHost(h2, h2_write)}
    selection = Selection((h1, h2), Rendezvous("h1", 29400))
    result = check_probes.run_allreduce(selection, sessions, {"h1": "zt0", "h2": "zt0"}, "check-x", "/venv/bin/python",
                                        AllReduceBudget(90, 60))
    return result, sessions


def test_a_write_that_fails_is_the_all_reduces_failure_naming_host_folder_and_error() -> None:
    error = f"Traceback (most recent call last):\n  File \"<string>\", line 6, in <module>\n{FULL}\n"
    result, sessions = allreduce(CommandResult(1, "", error))
    assert result == AllReduceResult(ProbeStatus.FAILED, f"host 'h2': cannot write the probe's files in "
                                                         f"~/meshrun/runs/check-x: {FULL}")
    assert (sessions["h1"].writes, sessions["h2"].writes) == (3, 1)  # h2 stopped at its first failed file


@pytest.mark.parametrize("raised,why", [
    (MeshrunError("host 'h2': `/venv/bin/python` took more than 30 s"), "`/venv/bin/python` took more than 30 s"),
    (MeshrunError("host 'h2': the SSH connection is closed"), "the SSH connection is closed"),
])
def test_a_write_that_does_not_answer_is_the_all_reduces_failure(raised: MeshrunError, why: str) -> None:
    result, _ = allreduce(raised)
    assert result == AllReduceResult(ProbeStatus.FAILED, f"host 'h2': cannot write the probe's files in "
                                                         f"~/meshrun/runs/check-x: {why}")


def test_a_write_with_no_stderr_gives_its_exit_status() -> None:
    result, _ = allreduce(CommandResult(137, "", ""))
    assert result.detail == "host 'h2': cannot write the probe's files in ~/meshrun/runs/check-x: exit status 137"
