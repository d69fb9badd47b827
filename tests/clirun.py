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


def trap_project(parent: Path, port: int) -> tuple[Path, Path, str]:
    """A git project under `parent` whose inventory's one host, gpu1, is 127.0.0.1:`port` (a listening
    trap: a task that dials a host lands there), with a fresh key and an empty known_hosts. Returns the
    project, the key, and gpu1's YAML lines, for inventories of the test's own."""
    root = git_project(parent)
    (root / "inventory").mkdir()
    key = root.parent / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = f"    address: 127.0.0.1\n    port: {port}\n    user: nobody\n    identity: {key}\n"
    (root / "inventory" / "hosts.yaml").write_text(f"hosts:\n  gpu1:\n{host}known_hosts: known_hosts\n")
    (root / "inventory" / "known_hosts").write_text("")
    return root, key, host
