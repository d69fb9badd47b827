"""Helpers for tests that run the installed `meshrun` command as a user would: a real subprocess in a
fresh git project under the test's temporary directory.

Apart from tests/fabrun.py on purpose: importing that one copies this whole working tree for `fab`,
which a test of the command's own answers does not need. Not in tests/conftest.py either: its
fixtures reach every test file, and these tests' `project` fixtures differ (scope, files made).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MESHRUN = str(Path(sys.executable).parent / "meshrun")


def git_project(parent: Path, name: str = "proj") -> Path:
    """`parent/name`, made (with its parents) and `git init`-ed: meshrun's project is a git checkout."""
    root = parent / name
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def meshrun_env(extra: dict[str, str] | None = None, *, ssh_config: str | None = os.devnull) -> dict[str, str]:
    """This process's environment for a `meshrun` run: without MESHRUN_INVENTORY (the developer's own
    inventory would be read instead of the test's), MESHRUN_SSH_CONFIG set to `ssh_config` (the
    default, /dev/null, keeps ~/.ssh/config out; None leaves this process's value), then `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"}
    if ssh_config is not None:
        env["MESHRUN_SSH_CONFIG"] = ssh_config
    return env | (extra or {})


def run_meshrun(cwd: Path, *args: str, env: dict[str, str] | None = None, ssh_config: str | None = os.devnull,
                stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """`meshrun ARGS` run to completion in `cwd`, in meshrun_env(env, ssh_config=ssh_config); stdin
    /dev/null unless given (None: this process's, as some tests always had it)."""
    return subprocess.run([MESHRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=meshrun_env(env, ssh_config=ssh_config), stdin=stdin)
