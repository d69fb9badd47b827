"""check-network names a login shell that garbles or refuses meshrun's commands (findings "stalls",
1 and 5, the detection): scripts that print on stdout (~/.bashrc under sshd, ~/.zshenv) made the
link probe "not start" and `fab train` say "no route"; a tcsh or fish login shell failed the facts
probe and the check blamed `python:`.

A host here is this machine behind a real shell that runs each command as sshd does, one string
(deploy/run/shell.py's remote_command) given to the login shell with -c; bash sources $BASH_ENV
as it sources ~/.bashrc under sshd. tcsh and fish are the real ones where installed."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.loginshell import login_noise, non_posix_line, non_posix_shell
from meshrun.deploy.check.verdicts import host_findings
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.shell import remote_command
from meshrun.layout import ENV_SSH_CONFIG
from tests.conftest import REQUIRE_ENV
from tests.fakesession import FakeSession, host

BANNER = "Welcome to gpu1 (conda base activated)"
LOGIN = "root@10.147.17.5"  # fakesession's host: user root at its address
QUIET_FIX = ("rsync and meshrun need a quiet non-interactive shell; put `[[ $- == *i* ]] || return` in ~/.bashrc "
             "before anything that prints (likewise in ~/.zshenv for zsh), or send that text to stderr")


class LoginShell:
    """This machine as a host whose login shell is `shell`: every command is one string run with -c."""

    def __init__(self, shell: str, the_host: Host, env: dict[str, str] | None = None) -> None:
        self.shell, self.host, self.env = shell, the_host, {**os.environ, **(env or {})}

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        command = remote_command(self.host.workdir, argv, create_workdir=create_workdir)
        done = subprocess.run([self.shell, "-c", command], capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.host.workdir)
        return CommandResult(done.returncode, done.stdout, done.stderr)


@pytest.fixture(autouse=True)
def no_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SSH_CONFIG, os.devnull)  # user@host as the inventory alone says it


def this_machine(tmp_path: Path, python: str = sys.executable) -> Host:
    return dataclasses.replace(host(), python=python, workdir=str(tmp_path))


def test_login_scripts_that_print_fail_the_host_alone_with_the_fix(tmp_path: Path) -> None:
    bashrc = tmp_path / "bashrc"
    bashrc.write_text(f"echo '{BANNER}'\nprintf '\\033[1mload 0.5\\n'\n")
    session = LoginShell("bash", this_machine(tmp_path), {"BASH_ENV": str(bashrc)})
    facts = check_probes.host_facts(session, session.host, None, sys.executable)
    assert (facts.login_noise, facts.login) == (f"{BANNER} [1mload 0.5", LOGIN)
    assert host_findings(facts, {}) == [Finding(Level.FAIL, "h1", (
        f"the login scripts of {LOGIN} print to stdout ('{BANNER} [1mload 0.5') before every command's output: "
        + QUIET_FIX))]
    # No link probe starts there: its listener's first line would be the banner ("did not start").
    fake = FakeSession("", the_host=session.host)
    assert check_probes.probe_pairs((session.host,), session.host, 29400, {"h1": fake}, (facts,), 0.0,
                                    sys.executable) == (None, ())
    assert fake.streams == []


def test_a_quiet_login_shell_is_no_finding(tmp_path: Path) -> None:
    session = LoginShell("bash", this_machine(tmp_path), {"BASH_ENV": ""})
    facts = check_probes.host_facts(session, session.host, None, sys.executable)
    assert (facts.login_noise, facts.fingerprint is not None and facts.fingerprint.python) == (None, sys.version.split()[0])
    assert not [f for f in host_findings(facts, {}) if "login" in f.message]


def installed(shell: str) -> None:
    """tests/run installs tcsh and fish; elsewhere a missing one skips, and in CI it fails."""
    if shutil.which(shell) is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{shell} is required in CI ({REQUIRE_ENV}=1): tests/run installs it", pytrace=False)
        pytest.skip(f"{shell} is not installed (apt-get install {shell}; tests/run does)")


def test_a_tcsh_login_shell_is_named_not_python(tmp_path: Path) -> None:
    installed("tcsh")
    session = LoginShell("tcsh", this_machine(tmp_path))
    facts = check_probes.host_facts(session, session.host, None, sys.executable)
    assert facts.fingerprint is not None and facts.fingerprint.error == f"`{sys.executable}`: Unmatched '''."
    assert host_findings(facts, {}) == [Finding(Level.FAIL, "h1", (
        f"the login shell of {LOGIN} is not POSIX (it answers as tcsh/csh does: `{sys.executable}`: Unmatched '''.); "
        "meshrun runs every command through it and needs sh, bash or zsh: `chsh -s /bin/bash root` there"))]


def test_a_fish_login_shell_is_named_though_its_last_line_is_a_caret(tmp_path: Path) -> None:
    """fish ends its error on a line of carets under the command: that was the reason the check quoted."""
    installed("fish")
    missing = str(tmp_path / "no-such-python")
    session = LoginShell("fish", this_machine(tmp_path, missing))
    assert session.run([missing, "-c", "pass"]).stderr.strip().splitlines()[-1].strip().startswith("^")
    facts = check_probes.host_facts(session, session.host, None, sys.executable)
    assert facts.fingerprint is not None and facts.fingerprint.error == f"`{missing}`: fish: Unknown command: {missing}"
    assert host_findings(facts, {}) == [Finding(Level.FAIL, "h1", (
        f"the login shell of {LOGIN} is not POSIX (it answers as fish does: `{missing}`: fish: Unknown command: "
        f"{missing}); meshrun runs every command through it and needs sh, bash or zsh: `chsh -s /bin/bash root` there"))]


def test_a_python_that_is_missing_under_a_posix_shell_is_still_blamed_on_python(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    session = LoginShell("sh", this_machine(tmp_path, missing))
    facts = check_probes.host_facts(session, session.host, None, sys.executable)
    [finding] = host_findings(facts, {})
    assert finding.message.startswith("the host's python did not run (") and "set `python:`" in finding.message


def test_the_signs_read_as_pure_text() -> None:
    assert login_noise("") is None and login_noise("\n \n") is None
    assert login_noise("a\tb\r\n\x1b[0m" + "x" * 100) == "a b [0m" + "x" * 53
    assert [non_posix_shell(t) for t in ("Unmatched '''.", 'Unmatched \'"\'.', "python3: Command not found.",
                                         "Badly placed ()'s.", "fish: Unknown command: python3",
                                         "bash: python3: command not found", "SyntaxError: Unmatched ')'")] == [
        "tcsh/csh", "tcsh/csh", "tcsh/csh", "tcsh/csh", "fish", None, None]
    assert non_posix_line("fish: Unsupported use of '&&'.\ncd x && exec y\n     ^^\n") == "fish: Unsupported use of '&&'."
    assert non_posix_line("Traceback\nValueError: x\n") is None
