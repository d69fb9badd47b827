"""A host without `ip`, or with an iproute2 older than 4.13 (no `-j`), is told so (network55 finding 9):
every multi-host `fab train`, `fab firewall up` and check finds the training interface with
`ip -j route get`, and a missing or old tool used to read "no route to ... check the host's network".
Exact equality on route_dev's message over a session that answers as such a host does; a local
host whose PATH has no `ip` through the real LocalSession; the facts probe now says where `ip` is."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.edges.host_queries import route_dev, route_interface
from meshrun.deploy.edges.transport import CommandResult, LocalSession
from meshrun.deploy.host import facts
from tests.fakesession import failure, host

INSTALL = ("meshrun finds the training interface with `ip -j route get`: install iproute2 >= 4.13 there "
           "(apt-get install iproute2)")
NO_ROUTE = "check the host's network and its route to the peer"


class Answering:
    """A host that answers every command with `rc` and `stderr` (no stdout), as a failed `ip` does."""

    def __init__(self, rc: int, stderr: str) -> None:
        self.host, self.rc, self.stderr = host(), rc, stderr

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        return CommandResult(self.rc, "", self.stderr)


@pytest.mark.parametrize("rc,stderr,message", [
    (127, "bash: line 1: exec: ip: not found\n",
     "host 'h1': `ip` (iproute2) was not found on its PATH (bash: line 1: exec: ip: not found); " + INSTALL),
    (127, "", "host 'h1': `ip` (iproute2) was not found on its PATH (exit status 127); " + INSTALL),
    (1, "zsh: command not found: ip\n",
     "host 'h1': `ip` (iproute2) was not found on its PATH (zsh: command not found: ip); " + INSTALL),
    (255, 'Option "-j" is unknown, try "ip -help".\n',
     "host 'h1': its `ip` has no JSON output (`-j`, iproute2 >= 4.13) (Option \"-j\" is unknown, try \"ip -help\".); "
     + INSTALL),
    (1, "ip: invalid option -- 'j'\n",
     "host 'h1': its `ip` has no JSON output (`-j`, iproute2 >= 4.13) (ip: invalid option -- 'j'); " + INSTALL),
])
def test_a_missing_or_old_ip_is_named_not_the_network(rc: int, stderr: str, message: str) -> None:
    assert failure(lambda: route_dev(Answering(rc, stderr), "10.147.17.1")) == message  # type: ignore[arg-type]
    assert failure(lambda: route_interface(Answering(rc, stderr), "10.147.17.1")) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("stderr,last", [
    ("RTNETLINK answers: Network is unreachable\n", "RTNETLINK answers: Network is unreachable"),
    # a login script's own missing command is no word about `ip`
    ("bash: fortune: command not found\nRTNETLINK answers: No route to host\n", "RTNETLINK answers: No route to host"),
])
def test_a_real_routing_failure_still_points_at_the_network(stderr: str, last: str) -> None:
    assert failure(lambda: route_dev(Answering(2, stderr), "10.147.17.1")) == (  # type: ignore[arg-type]
        f"host 'h1': no route to 10.147.17.1 ({last}); {NO_ROUTE}")


def test_a_local_host_without_ip_on_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's own machine (`address: local`): the exec fails, and the session says rc 127."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    local = LocalSession(dataclasses.replace(host(), address="local", workdir=str(tmp_path / "work")), tmp_path)
    assert failure(lambda: route_dev(local, "10.147.17.1")) == (
        "host 'h1': `ip` (iproute2) was not found on its PATH (ip: No such file or directory); " + INSTALL)


def test_the_facts_probe_says_where_ip_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ip = tmp_path / "ip"
    ip.write_text("#!/bin/sh\n")
    ip.chmod(ip.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert facts.tool_paths()["ip"] == str(ip)
