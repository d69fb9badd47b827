"""`fab setup` on a simulated host: a real venv, a real `pip install -e` of the synced code.

The venv reuses the test interpreter's packages (`--reuse-site`) so no host downloads torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fabrun import fab

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BASE = getattr(sys, "_base_executable", sys.executable)


def test_setup_creates_an_environment_once_and_then_changes_nothing(testbed, inventory: Path) -> None:
    args = ["setup", "--inventory", str(inventory), "--hosts", "h2", "--base", BASE, "--reuse-site", sys.executable]
    first = fab(*args, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "h2: created venv /root/meshrun/.venv" in first.stdout
    assert "installed meshrun (pip install -e .)" in first.stdout and "(torch 2." in first.stdout
    assert "set `python: /root/meshrun/.venv/bin/python`" in first.stderr

    again = fab(*args, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "h2: already set up, nothing to do" in again.stdout

    seen = testbed.exec(2, ["/root/meshrun/.venv/bin/python", "-c",
                            "import os, deploy, torch; os.chdir('/'); print(deploy.__file__)"])
    assert seen.stdout.strip() == "/root/meshrun/deploy/__init__.py"
    assert testbed.exec(1, ["test", "-e", "/root/meshrun/.venv"], check=False).returncode != 0  # h2 only
