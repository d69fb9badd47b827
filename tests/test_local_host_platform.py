"""`address: local` on a controller that is not Linux is refused in one line before any command
runs there (macos55 finding 1): the local host runs meshrun's host agent and torchrun on this
machine, and they need /proc and prctl. On macOS the agent died with `SubprocessError: Exception
occurred in preexec_fn.` (libc has no prctl) before torchrun started, and `fab status`/`fab stop`
could not find the run in /proc.

No Mac here: the system name is the parameter `platform.system()` fills in, and these tests pass
"Darwin" for it. The refusal sits where every local host's session is made (`LocalSession`, what
`transport.connect` returns for it), so every task's command to a local host meets it. And the
agent's preexec for torchrun is none off Linux, as deploy/edges/localproc's already was, so it
never raises in a child."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshrun.deploy.edges.transport import LocalSession, connect, local_host_refusal
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host.procs import die_with_parent
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host

REPO = Path(__file__).resolve().parents[1]
ON_A_MAC = ("host 'local': `address: local` runs meshrun's host agent on this machine, which needs Linux "
            "(/proc, prctl); this machine is Darwin: train on a Linux host (a VM or a remote box) instead")


def bundled_local_host() -> Host:
    """The host of meshrun's default inventory, the README quick start's (inventory/local.yaml)."""
    inventory = load_inventory(REPO / "inventory" / "local.yaml", REPO)
    assert [h.name for h in inventory.hosts] == ["local"] and inventory.hosts[0].is_local
    return inventory.hosts[0]


def test_a_local_host_off_linux_is_one_line_naming_it() -> None:
    """Darwin passed as the system name: the refusal, exact; Linux: none."""
    assert local_host_refusal("local", "Darwin") == ON_A_MAC
    assert local_host_refusal("local", "Linux") is None
    assert local_host_refusal("box", "") == (
        "host 'box': `address: local` runs meshrun's host agent on this machine, which needs Linux (/proc, prctl); "
        "this machine is not Linux: train on a Linux host (a VM or a remote box) instead")


def test_the_local_session_is_refused_off_linux_before_any_command(tmp_path: Path) -> None:
    """The session every command to a local host goes through, made with the system "Darwin": a
    MeshrunError (one red line, exit 1 at the error boundary), no session, nothing run."""
    with pytest.raises(MeshrunError) as info:
        LocalSession(bundled_local_host(), tmp_path, system="Darwin")
    assert str(info.value) == ON_A_MAC
    assert info.value.exit_code == 1


def test_on_linux_connect_still_gives_a_working_local_session() -> None:
    """This machine is Linux (the tests' host): the default inventory's local host connects and runs."""
    session = connect(bundled_local_host(), None, REPO)
    assert isinstance(session, LocalSession)
    result = session.run(["python3", "-c", "print('here')"], timeout=30)
    assert (result.rc, result.stdout) == (0, "here\n")


def test_the_agents_preexec_for_torchrun_is_none_off_linux() -> None:
    """Darwin passed as the system name: no preexec_fn (Popen's None), so nothing looks up prctl in
    the child; on Linux the PR_SET_PDEATHSIG preexec as before."""
    assert die_with_parent(os.getpid(), system="Darwin") is None
    assert callable(die_with_parent(os.getpid(), system="Linux"))
