"""Fabric's own options before the task (`-H`, `-i`, `-S`, ...) are listed in `meshrun --help` and
`fab --help`, but meshrun makes its own connections from the inventory, so they did nothing, and `-H
a,b` ran the task once per name, each time on every host. They are refused with one line and exit
status 2 before the task starts, by `meshrun` and by `fab` with the one-line fabfile alike; a
project's own Fabric tasks in the same fabfile keep them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.fabexec import fabric_option_problem
from tests.clirun import MESHRUN, git_project, meshrun_env

FAB = [sys.executable, "-m", "fabric"]
BEFORE = "before the task is Fabric's own option, which meshrun does not use; "


def test_each_option_gets_what_meshrun_reads_instead() -> None:
    ask = fabric_option_problem
    assert ask({}, "meshrun", "train", True) is None
    assert ask({"hosts": "", "identity": [], "connect-timeout": 0}, "meshrun", "train", True) is None
    assert ask({"hosts": "gpu1,gpu2"}, "meshrun", "train", True) == (
        f"-H/--hosts {BEFORE}put it after the task: meshrun train --hosts gpu1,gpu2")
    assert ask({"hosts": "gpu1"}, "fab", "status", False) == f"-H/--hosts {BEFORE}fab status takes no --hosts"
    assert ask({"hosts": "a b\nc"}, "fab", "setup", True) == (
        f"-H/--hosts {BEFORE}put it after the task: fab setup --hosts 'a b\\nc'")
    assert ask({"identity": ["~/.ssh/k"]}, "meshrun", "sync", True) == (
        f"-i/--identity {BEFORE}name the SSH key as `identity:` in the inventory (or IdentityFile in "
        "$MESHRUN_SSH_CONFIG, else ~/.ssh/config)")
    assert ask({"ssh-config": "my config"}, "meshrun", "trust", True) == (
        f"-S/--ssh-config {BEFORE}set MESHRUN_SSH_CONFIG='my config' instead (default ~/.ssh/config)")
    assert ask({"connect-timeout": 5}, "fab", "train", True) == (
        f"-t/--connect-timeout {BEFORE}fab check-network and fab trust take --timeout SECONDS after the task")
    assert ask({"prompt-for-passphrase": True}, "meshrun", "setup", True) == (
        f"--prompt-for-passphrase {BEFORE}add the key to ssh-agent (ssh-add KEY): meshrun offers the agent's keys")
    assert ask({"prompt-for-login-password": True}, "meshrun", "setup", True) == (
        f"--prompt-for-login-password {BEFORE}meshrun logs in with SSH keys only: `identity:` in the inventory, "
        "or ssh-agent")
    assert ask({"dry": True}, "meshrun", "stop", False) == (
        f"-R/--dry {BEFORE}it would not keep meshrun stop from acting; drop it")
    for name, shown in (("command-timeout", "-T/--command-timeout"), ("echo", "-e/--echo"), ("pty", "-p/--pty"),
                        ("warn-only", "-w/--warn-only"), ("hide", "--hide"),
                        ("prompt-for-sudo-password", "--prompt-for-sudo-password")):
        assert ask({name: 1}, "meshrun", "train", True) == (
            f"{shown} {BEFORE}meshrun runs no commands through Fabric; drop it")
    # The first given, in FABRIC_ONLY's order: -H, whose copies ran the task again and again, comes first.
    assert ask({"dry": True, "hosts": "a"}, "meshrun", "sync", True).startswith("-H/--hosts ")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return git_project(tmp_path)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`meshrun` or `fab`, run alike (MESHRUN_SSH_CONFIG as this process has it)."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=meshrun_env(ssh_config=None), stdin=subprocess.DEVNULL)


NO_RUNS = "no runs recorded under"  # what `status` prints in a project without runs: the task ran


def test_meshrun_refuses_hosts_before_the_task_and_runs_nothing(project: Path) -> None:
    done = _run([MESHRUN, "-H", "a,b", "status"], project)
    assert (done.returncode, done.stdout) == (2, "")  # once, it printed NO_RUNS twice and exited 0
    assert done.stderr == f"error: -H/--hosts {BEFORE}meshrun status takes no --hosts\n"
    done = _run([MESHRUN, "--hosts", "gpu1,gpu2", "sync"], project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: -H/--hosts {BEFORE}put it after the task: meshrun sync --hosts gpu1,gpu2\n"
    # The task itself runs when nothing of Fabric's is given (so the refusal above is what stopped it).
    assert NO_RUNS in _run([MESHRUN, "status"], project).stdout


def test_ssh_config_and_prompts_are_refused_before_fabric_reads_or_asks(project: Path) -> None:
    """-S with a missing file was Fabric's traceback; --prompt-for-passphrase asked, then went unused."""
    done = _run([MESHRUN, "-S", "missing.conf", "status"], project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: -S/--ssh-config {BEFORE}set MESHRUN_SSH_CONFIG=missing.conf instead "
                           "(default ~/.ssh/config)\n")
    done = _run([MESHRUN, "--prompt-for-passphrase", "-i", "k", "status"], project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: -i/--identity ") and "passphrase" not in done.stderr.lower()


def test_help_and_list_still_answer_with_those_options(project: Path) -> None:
    listed = _run([MESHRUN, "-H", "a", "--list"], project)
    assert listed.returncode == 0 and "train" in listed.stdout
    helped = _run([MESHRUN, "-H", "a", "train", "--help"], project)
    assert helped.returncode == 0 and "--script" in helped.stdout


def test_in_process_the_program_exits_2_before_the_task(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from meshrun.deploy.program import program

    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as stopped:
        program.run(["meshrun", "-H", "a,b", "status"])
    out, err = capsys.readouterr()
    assert (stopped.value.code, out) == (2, "")
    assert err == f"error: -H/--hosts {BEFORE}meshrun status takes no --hosts\n"


def test_fab_with_the_one_line_fabfile_refuses_them_for_meshrun_tasks_only(project: Path) -> None:
    (project / "fabfile.py").write_text(
        "from fabric import task\n"
        "from meshrun.deploy.tasks import *  # noqa: F401,F403\n\n\n"
        "@task\ndef hello(c):\n    print('hello', c.host)\n")
    done = _run([*FAB, "-H", "a,b", "status"], project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: -H/--hosts {BEFORE}fab status takes no --hosts\n"
    done = _run([*FAB, "-H", "a,b", "train"], project)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: -H/--hosts {BEFORE}put it after the task: fab train --hosts a,b\n"
    # The project's own task is Fabric's to run: once per -H host, as Fabric documents.
    own = _run([*FAB, "-H", "a,b", "hello"], project)
    assert (own.returncode, own.stdout) == (0, "hello a\nhello b\n"), own.stderr
