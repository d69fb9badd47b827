"""The `meshrun` command and project discovery, without hosts: the command lists the same tasks
as `fab`, works from any directory, and refuses what cannot be run with one line and exit 2
before touching any host (no inventory is even needed for these)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.inventory.shown import shown_path
from tests.clirun import git_project, run_meshrun
from tests.fabrun import REPO

TASKS = ["check-network", "fetch-checkpoints", "firewall", "join", "leave", "logs", "report", "setup", "status",
         "stop", "sync", "train", "trust"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, *args, ssh_config=None, stdin=None)


def listed(output: str) -> list[str]:
    """Task names: indented by two, where wrapped help lines are indented further."""
    return [line.split()[0] for line in output.splitlines() if line.startswith("  ") and line[2:3].strip()]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = git_project(tmp_path)
    (root / "sub").mkdir()
    (root / "main.py").write_text("print('hi')\n")
    return root


def test_meshrun_lists_the_same_tasks_as_fab_from_any_directory(tmp_path: Path) -> None:
    mine = run("--list", cwd=tmp_path)
    fab = subprocess.run([sys.executable, "-m", "fabric", "-l"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert mine.returncode == 0 and fab.returncode == 0, mine.stderr + fab.stderr
    assert listed(mine.stdout) == TASKS
    assert listed(fab.stdout) == TASKS


def test_outside_a_git_repository_is_one_line_naming_the_way_out(tmp_path: Path) -> None:
    done = run("status", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: {tmp_path.resolve()}: not inside a git repository; run meshrun from your "
                           "project's checkout (`git init` it first) or pass --project DIR\n")


def test_the_project_is_the_git_root_even_from_a_subfolder(project: Path) -> None:
    done = run("train", "--script", "nope.py", cwd=project / "sub")
    assert (done.returncode, done.stderr) == (2, f"error: --script nope.py: no such file in the project {project.resolve()}\n")


def test_script_and_config_must_lie_inside_the_project(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    done = run("train", "--script", str(outside), cwd=project)
    assert done.returncode == 2
    assert done.stderr == (f"error: --script {outside}: not inside the project {project.resolve()}; only the "
                           "project's files reach the hosts (move it in, or pass --project)\n")
    config = run("train", "--config", "configs/none.yaml", cwd=project)
    assert config.stderr == f"error: --config configs/none.yaml: no such file in the project {project.resolve()}\n"


def test_no_inventory_anywhere_names_the_lookup_order(project: Path, tmp_path: Path) -> None:
    env_home = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": ""}
    done = run_meshrun(project, "train", "--script", "main.py", env=env_home, ssh_config=None, stdin=None)
    assert done.returncode == 2
    before = ("error: no inventory found (looked for --inventory, $MESHRUN_INVENTORY, the project's "
              "inventory/hosts.yaml or inventory/local.yaml, ~/.config/meshrun/inventory.yaml); write ")
    after = ' (README, "Many machines") or pass --inventory FILE'
    # The path gets the room the line leaves (300 characters in all); a longer one loses its middle, not its end.
    where = shown_path(project.resolve() / "inventory/hosts.yaml", 300 - len(before) - len(after))
    assert where.endswith("/proj/inventory/hosts.yaml")
    assert done.stderr == f"{before}{where}{after}\n" and len(done.stderr) <= 301


def test_project_and_runs_dir_flags_choose_where_runs_are_read(project: Path, tmp_path: Path) -> None:
    done = run("status", "--project", str(project), "--runs-dir", str(tmp_path / "records"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    missing = run("status", "--project", str(tmp_path / "absent"), cwd=tmp_path)
    assert (missing.returncode, missing.stderr) == (
        2, f"error: --project {tmp_path / 'absent'}: no such directory; name your project's checkout\n")
