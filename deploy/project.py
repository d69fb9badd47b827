"""The project meshrun works on: the user's repository. Its files are what `sync` ships to the
hosts, `--script` and `-c` paths are relative to its root (not to the current directory), and the
controller records runs under its `runs/` (or `--runs-dir`). meshrun's own clone is just one
project among others.

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


def relative_to_project(path: str, project: Project, flag: str, packaged_ok: bool = False,
                        cwd: Path | None = None) -> str:
    """`path` (a --script or --config value) as the path inside the project that the hosts will
    find: given relative to the project root, or absolute inside it. With `packaged_ok`, a bare
    name the project lacks passes through: the trainer then looks among its shipped configs
    (and says which exist if it is none of them). A relative path that names another file of the
    project from `cwd` (default: the current directory) is refused, naming that file: typed in
    experiments/, `train.py` means experiments/train.py to the person, the root's to meshrun."""
    candidate = Path(path).expanduser()
    here = None if candidate.is_absolute() else _from_here(candidate, project.root, cwd)
    if packaged_ok and candidate.name == path and flag_path_stat(flag, project.root / path) is None:
        if here is not None:
            raise InputError(_not_from_here(flag, path, project.root, here) +
                             f" (or run from the project root for meshrun's shipped {path})")
        return path
    full = (candidate if candidate.is_absolute() else project.root / candidate).resolve()
    inside = _inside(full, project.root)
    found = flag_path_stat(flag, full) if inside is not None else None
    exists = found is not None and stat.S_ISREG(found.st_mode)
    if here is not None and here != inside:
        if not exists:
            raise InputError(_not_from_here(flag, path, project.root, here))
        raise InputError(f"{flag} {path}: ambiguous: paths are relative to the project root, so this is {full}, "
                         f"not {here.as_posix()} in the current directory; pass {flag} {here.as_posix()} for that "
                         "one, or the absolute path for the root's")
    if inside is None:
        raise InputError(f"{flag} {path}: not inside the project {project.root}; only the project's files "
                         "reach the hosts (move it in, or pass --project)")
    if not exists:
        module = _module_named(path, project.root) if flag == "--script" else None
        if module is not None:
            raise InputError(_module_message(path, module, project.root))
        raise InputError(f"{flag} {path}: no such file in the project {project.root}")
    return inside.as_posix()


def _module_named(path: str, root: Path) -> str | None:
    """The module `path` names as `torchrun -m` would take it: `-m pkg.train`, or a bare `pkg.train`
    when the project has that module's file (`cifar10_toy.yaml` is a missing file, not a module)."""
    name = path[2:].strip() if path.startswith("-m") else path
    if not name or not all(part.isidentifier() for part in name.split(".")):
        return None
    return name if path.startswith("-m") or _module_file(name, root) is not None else None


def _module_file(module: str, root: Path) -> Path | None:
    """The project's file for `module` (pkg/train.py, or pkg/train/__main__.py), relative to the root."""
    stem = Path(*module.split("."))
    try:
        return next((f for f in (stem.with_suffix(".py"), stem / "__main__.py") if (root / f).is_file()), None)
    except OSError:  # a name too long for the system: no such module file
        return None


def _module_message(path: str, module: str, root: Path) -> str:
    """--script runs a file as `python FILE` does: sys.path[0] is the file's folder and it has no
    package, so `from .models import x` (and `import pkg.x`) in the module's file fail. A launcher
    at the project root puts the root on the path and runs the module as `python -m` would;
    alter_sys keeps it `sys.modules["__main__"]` while it runs, so its classes pickle."""
    stem, found = Path(*module.split(".")), _module_file(module, root)
    direct = "pass " if found is None else f"pass --script {found.as_posix()} if it imports none of its package, else "
    return (f"--script {path}: --script takes a file, not a module; {direct}a launcher run_{stem.name}.py holding: "
            f"import runpy; runpy.run_module(\"{module}\", run_name=\"__main__\", alter_sys=True) (docs/scripts.md)")


def _inside(full: Path, root: Path) -> Path | None:
    try:
        return full.relative_to(root)
    except ValueError:
        return None


def _from_here(candidate: Path, root: Path, cwd: Path | None) -> Path | None:
    """The project file (its path from the root) that relative `candidate` names from `cwd`, if it
    names a regular file of the project from there; None otherwise."""
    try:
        full = (Path(cwd or os.getcwd()) / candidate).resolve()
        inside = _inside(full, root)
        return inside if inside is not None and stat.S_ISREG(full.stat().st_mode) else None
    except OSError:  # the current directory is gone, or that name cannot be looked at: no other meaning
        return None


def _not_from_here(flag: str, path: str, root: Path, here: Path) -> str:
    return (f"{flag} {path}: paths are relative to the project root {root}, not the current directory; "
            f"did you mean {flag} {here.as_posix()}?")
