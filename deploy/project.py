"""The project meshrun works on: the user's repository. Its files are what `sync` ships to the
hosts, `--script` and `-c` paths are relative to it, and the controller records runs under its
`runs/` (or `--runs-dir`). meshrun's own clone is just one project among others.

Found once per command: `--project DIR`, else the git root of the current directory.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from meshrun.layout import RUNS_DIR
from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import flag_path_stat

PROJECT_HELP = "the project to run (default: the git repository holding the current directory)"
RUNS_DIR_HELP = "where this controller records runs (default: the project's runs/)"


@dataclass(frozen=True)
class Project:
    root: Path  # whose files ship to hosts; a local host's relative workdir is inside it
    runs: Path  # the controller's run records: <runs>/<run_id>/launch.json, summary.json, ...

    def run_home(self, run_id: str) -> Path:
        return self.runs / run_id


def find_project(project_arg: str | None, runs_arg: str | None, cwd: Path | None = None) -> Project:
    """The project from the flags (paths relative to `cwd`), else the git root of `cwd`."""
    here = Path(cwd or os.getcwd())
    if project_arg:
        root = (here / Path(project_arg).expanduser()).resolve()
        found = flag_path_stat("--project", root)
        if found is None or not stat.S_ISDIR(found.st_mode):
            raise InputError(f"--project {project_arg}: no such directory; name your project's checkout")
    else:
        root = git_root(here)
    runs = (here / Path(runs_arg).expanduser()).resolve() if runs_arg else root / RUNS_DIR
    found = flag_path_stat("--runs-dir", runs)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise InputError(f"--runs-dir {runs}: exists and is not a directory; name a directory for run records")
    return Project(root, runs)


def git_root(here: Path) -> Path:
    try:
        done = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InputError(f"cannot run git to find the project ({err}); install git, or pass --project DIR") from None
    if done.returncode != 0:
        raise InputError(f"{here}: not inside a git repository; run meshrun from your project's checkout "
                         "(`git init` it first) or pass --project DIR")
    return Path(done.stdout.strip()).resolve()


def relative_to_project(path: str, project: Project, flag: str, packaged_ok: bool = False) -> str:
    """`path` (a --script or --config value) as the path inside the project that the hosts will
    find: given relative to the project root, or absolute inside it. With `packaged_ok`, a bare
    name the project lacks passes through: the trainer then looks among its shipped configs
    (and says which exist if it is none of them)."""
    candidate = Path(path).expanduser()
    if packaged_ok and candidate.name == path and flag_path_stat(flag, project.root / path) is None:
        return path
    full = (candidate if candidate.is_absolute() else project.root / candidate).resolve()
    try:
        inside = full.relative_to(project.root)
    except ValueError:
        raise InputError(f"{flag} {path}: not inside the project {project.root}; only the project's files "
                         "reach the hosts (move it in, or pass --project)") from None
    found = flag_path_stat(flag, full)
    if found is None or not stat.S_ISREG(found.st_mode):
        raise InputError(f"{flag} {path}: no such file in the project {project.root}")
    return inside.as_posix()
