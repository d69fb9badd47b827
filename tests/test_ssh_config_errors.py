"""ssh_config lines OpenSSH accepts, or refuses itself, that made paramiko raise while meshrun looked a host up
(deploy/edges/sshtarget.py): before, each ended as `internal error: KeyError: 'canonicaldomains'` or
`ValueError: No closing quotation`, exit status 1, naming neither the file nor the block.

- `CanonicalizeHostname yes` without `CanonicalDomains` is a no-op in ssh: it is one here too.
- A Match line with an unclosed quote, a CanonicalizeMaxDots that is no number: one line naming the file and
  the Match line or the Host looked up, exit status 2, before any host is dialled.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.sshtarget import Hop
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.model import Host, Network
from tests.clirun import run_meshrun, trap_project
from tests.trap import dialled, listening_trap

NAMED = "Host gpu1\n  HostName 203.0.113.7\n  User ubuntu\n  Port 2200\n"


def host(name: str, address: str, port: int | None = None) -> Host:
    return Host(name, address, ssh_address=None, user=None, port=port, identity=None, python=None,
                workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


def config_file(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text(text)
    monkeypatch.setenv("MESHRUN_SSH_CONFIG", str(path))
    return path


def refusal(h: Host) -> InputError:
    with pytest.raises(InputError) as info:
        sshtarget.check_all([h])
    assert info.value.exit_code == 2
    return info.value


@pytest.mark.parametrize("line", ["CanonicalizeHostname yes", "CanonicalizeHostname always",
                                  "canonicalizehostname=yes"])
def test_canonicalize_without_domains_changes_nothing_as_in_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                line: str) -> None:
    path = config_file(tmp_path, f"{NAMED}Host *\n  {line}\n", monkeypatch)
    sshtarget.check_all([host("gpu1", "10.0.0.1"), host("gpu2", "10.0.0.2")])
    assert sshtarget.resolve(host("gpu1", "10.0.0.1")).target == Hop("gpu1", "203.0.113.7", "ubuntu", 2200, (), "")
    assert sshtarget.resolve(host("gpu2", "10.0.0.2")).target == Hop("10.0.0.2", "10.0.0.2", "root", 22, (), "",
                                                                     user_defaulted=True)
    assert sshtarget.resolve(host("gpu2", "10.0.0.2")).config == path


def test_a_match_line_with_an_unclosed_quote_is_one_line_naming_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_file(tmp_path, f'{NAMED}Match exec "test -e /nonexistent\n  Port 2222\n', monkeypatch)
    assert str(refusal(host("gpu1", "10.0.0.1"))) == (
        f"{path}: cannot read ssh_config ('Match exec \"test -e /nonexistent': No closing quotation); fix the file "
        "or set MESHRUN_SSH_CONFIG")


def test_an_error_paramiko_raises_in_a_lookup_names_the_file_and_the_host(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_file(tmp_path, "Host *\n  CanonicalizeMaxDots many\n", monkeypatch)
    assert str(refusal(host("gpu1", "10.0.0.1"))) == (
        f"host 'gpu1': {path}: ssh_config cannot be applied to Host 'gpu1' (ValueError: invalid literal for int() "
        "with base 10: 'many'); fix the file or set MESHRUN_SSH_CONFIG")


@pytest.fixture(scope="module")
def trap() -> Iterator[socket.socket]:
    yield from listening_trap()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, trap: socket.socket) -> Path:
    root = trap_project(tmp_path_factory.mktemp("ssh-config-errors"), trap.getsockname()[1])[0]
    (root / "canon").write_text("Host *\n  CanonicalizeHostname yes\n")
    (root / "exec").write_text('Match exec "test -e /nonexistent\n  Port 2222\n')
    return root


def check_network(project: Path, ssh_config: str) -> subprocess.CompletedProcess[str]:
    return run_meshrun(project, "check-network", "--timeout", "5", env={"HOME": str(project.parent)},
                       ssh_config=str(project / ssh_config), stdin=None)


def test_the_real_command_refuses_the_bad_file_in_one_line_and_dials_no_host(project: Path,
                                                                             trap: socket.socket) -> None:
    dialled(trap)
    done = check_network(project, "exec")
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"error: {project / 'exec'}: cannot read ssh_config ('Match exec \"test -e /nonexistent': No closing "
               "quotation); fix the file or set MESHRUN_SSH_CONFIG\n")
    assert dialled(trap) == 0


def test_the_real_command_goes_on_to_the_host_under_canonicalize_without_domains(project: Path,
                                                                                 trap: socket.socket) -> None:
    """The trap hangs up, so the host is unreachable (exit status 1): what matters is that it was dialled."""
    dialled(trap)
    done = check_network(project, "canon")
    assert done.returncode == 1 and "internal error" not in done.stderr and dialled(trap) >= 1, done.stderr[-500:]
