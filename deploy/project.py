"""The project meshrun works on: the user's repository. Its files are what `sync` ships to the
hosts, `--script` and `-c` paths are relative to its root (not to the current directory), and the
controller records runs under its `runs/` (or `--runs-dir`). meshrun's own clone is just one
project among others.

Found once per command: `--project DIR`, else the git root of the current directory.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Collection, Sequence

from meshrun.layout import RUNS_DIR
from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import flag_path_stat
from meshrun.deploy.inventory.shown import PATH_MAX, shown_path, with_path

PROJECT_HELP = "the project to run (default: the git repository holding the current directory)"
RUNS_DIR_HELP = "where this controller records runs (default: the project's runs/)"


@dataclass(frozen=True)
class Project:
    root: Path  # whose files ship to hosts; a local host's relative workdir is inside it
    runs: Path  # the controller's run records: <runs>/<run_id>/launch.json, summary.json, ...

    def run_home(self, run_id: str) -> Path:
        return self.runs / run_id


def find_project(project_arg: str | None, runs_arg: str | None, cwd: Path | None = None,
                 writes: bool = False) -> Project:
    """The project from the flags (paths relative to `cwd`), else the git root of `cwd`. A runs folder that
    can never exist (a file on its path) is refused for every task; with `writes` (a task that records runs:
    train, join, leave, fetch-checkpoints), one this controller cannot create or write in too: found only
    at the first record, it failed after every host was connected and synced. Without `writes` nothing
    is created: status, logs and report only read."""
    here = Path(cwd or os.getcwd())
    if project_arg:
        root = (here / Path(project_arg).expanduser()).resolve()
        found = flag_path_stat("--project", root)
        if found is None or not stat.S_ISDIR(found.st_mode):
            raise InputError(f"--project {project_arg}: no such directory; name your project's checkout")
    else:
        root = git_root(here)
    runs = (here / Path(runs_arg).expanduser()).resolve() if runs_arg else root / RUNS_DIR
    subject, fix = _runs_words(runs_arg is not None)
    blocker = _not_a_directory(runs)
    if blocker == runs:
        raise InputError(with_path(subject, runs, f": exists and is not a directory; {fix}"))
    if blocker is not None:
        raise InputError(with_path(subject, runs, f": {shown_path(blocker, PATH_MAX)} is not a directory, so "
                                   f"nothing can be made under it; {fix}"))
    problem = _write_problem(runs) if writes else None
    if problem is not None:
        raise InputError(with_path(subject, runs, f": {problem}; {fix}"))
    return Project(root, runs)


def _runs_words(given: bool) -> tuple[str, str]:
    """How a refusal names the runs folder, and what to do: the flag as typed, or the default it stands for."""
    if given:
        return "--runs-dir ", "name a directory this controller can write run records in"
    return "runs folder ", "pass --runs-dir DIR, a directory this controller can write run records in"


def _not_a_directory(runs: Path) -> Path | None:
    """The path nearest to `runs` (itself, else one of its folders) that exists and is no directory: a
    file where a folder must be (`notes.txt/runs`). None when the nearest that exists is a directory."""
    for place in (runs, *runs.parents):
        found = flag_path_stat("--runs-dir", place)
        if found is not None:
            return None if stat.S_ISDIR(found.st_mode) else place
    return None


def _write_problem(runs: Path) -> str | None:
    """Why this controller cannot record runs in `runs`: made here (as the first record would make it; a
    runs folder is never removed again), then a file created in it and removed. `os.access` would not
    do: it says yes to root where the file system itself refuses (/proc), and over NFS the server decides."""
    existed = runs.is_dir()
    try:
        runs.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".meshrun-write-check-", dir=runs)
    except OSError as err:
        reason = os.strerror(err.errno).lower() if err.errno else type(err).__name__
        return f"cannot write in it ({reason})" if existed else f"cannot create it ({reason})"
    os.close(handle)
    os.unlink(name)
    return None


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
    fixed = wrong_case(project.root, inside)
    if fixed is not None:  # a case-insensitive disk (macOS) found it; the Linux hosts will not
        raise InputError(case_message(flag, path, project.root / fixed if candidate.is_absolute() else fixed))
    if flag == "--script" and not is_python_source(path, _first_line(full)):
        raise InputError(f"--script {path}: meshrun runs a Python file under torchrun; put the environment in the "
                         "inventory's `env:` and pass the Python script it runs (docs/scripts.md)")
    return inside.as_posix()


def real_case(typed: PurePosixPath, names: Sequence[Collection[str]]) -> PurePosixPath | None:
    """`typed` (a path inside the project) with each component spelled as its folder spells it, where
    one differs from the real name only in case; None when every component is exact (or unknown).
    `names[i]`: the real names in the folder holding `typed.parts[i]`. On macOS's case-insensitive disk
    `stat("Train.py")` finds train.py, so only these names tell the two apart; on this Linux disk the
    tests give the names a Mac would list for a typed path that stat found."""
    parts, changed = list(typed.parts), False
    for index, (part, there) in enumerate(zip(typed.parts, names)):
        if part in there:
            continue
        same = sorted(name for name in there if name.casefold() == part.casefold())
        if same:
            parts[index], changed = same[0], True
    return PurePosixPath(*parts) if changed else None


def wrong_case(root: Path, inside: Path) -> PurePosixPath | None:
    """`real_case` of `inside` (from the project root), read from the disk: each folder along it listed.
    A folder that cannot be listed has no names to compare, and its component stays as typed."""
    typed = PurePosixPath(inside.as_posix())
    listings: list[frozenset[str]] = []
    for index in range(len(typed.parts)):
        try:
            listings.append(frozenset(os.listdir(root.joinpath(*typed.parts[:index]))))
        except (OSError, ValueError):
            listings.append(frozenset())
    return real_case(typed, listings)


def case_message(flag: str, path: str, real: PurePosixPath | Path) -> str:
    """The refusal of a --script or --config typed in another case than the project's file: it passes
    every check on a Mac's disk and fails on the hosts' (a path rsync and git send as spelled)."""
    return (f"{flag} {path}: the project's file is {real.as_posix()} (hosts' file systems are case-sensitive); "
            f"pass {flag} {real.as_posix()}")


def script_arg_warnings(args: tuple[str, ...], project: Project, cwd: Path | None = None) -> tuple[str, ...]:
    """`arg_path_warnings` for a script's `args` typed in `cwd` (default: the current directory): the
    facts it needs, read from the disk here. None from the project root itself, or from outside it."""
    here = Path(cwd or os.getcwd()).resolve()
    below = _inside(here, project.root)
    if below is None or below == Path("."):
        return ()
    words = path_words(args)
    return arg_path_warnings(words, PurePosixPath(below.as_posix()), frozenset(w for w in words if _exists(here / w)),
                             frozenset(w for w in words if _exists(project.root / w)))


def path_words(args: tuple[str, ...]) -> tuple[str, ...]:
    """The words of a script's arguments that may be relative paths: a word that is not a flag, and the
    value of `--opt=value` or `key=value` (once each, in order). Absolute and `~` paths mean the same
    from anywhere."""
    words: list[str] = []
    for arg in args:
        value = arg.split("=", 1)[1] if "=" in arg else None
        words += [w for w in (None if arg.startswith("-") else arg, value) if w and not w.startswith(("/", "~"))]
    return tuple(dict.fromkeys(words))


def arg_path_warnings(words: tuple[str, ...], here: PurePosixPath, found_here: frozenset[str],
                      found_at_root: frozenset[str]) -> tuple[str, ...]:
    """The WARNING lines for a script's path `words` typed in `here` (the current directory, from the
    project root): each one that names something from `here` (`found_here`) but not from the root
    (`found_at_root`), where every rank runs, and so would fail there with FileNotFoundError after the
    connect, sync and pre-flight. A warning, not a refusal: `--data` may put it there on the hosts."""
    lines = []
    for word in words:
        shown = posixpath.normpath((here / word).as_posix())
        if word in found_here and word not in found_at_root and not shown.startswith("../") and shown != "..":
            lines.append(f"script argument {word}: the ranks run in the project root, where it does not exist; "
                         f"from here it is {shown}")
    return tuple(lines)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the system: nothing there
        return False


SHELL_SUFFIXES = (".sh", ".bash", ".zsh")
# What a Python file's `#!` may name: python3, python3.11, pypy3, or uv (`uv run --script`: PEP 723 scripts)
_PYTHON_PROGRAM = re.compile(r"(python|pypy)[0-9.]*|uv")


def is_python_source(path: str, first_line: bytes) -> bool:
    """Whether --script `path`, whose file starts with `first_line`, can be the Python file the runner
    compiles: a wrapper `run.sh` (`export OMP_NUM_THREADS=4; python train.py`) would fail on every rank
    with a SyntaxError, after the connect, sync and pre-flight. No `#!` line: Python, as `python FILE` takes it."""
    if path.lower().endswith(SHELL_SUFFIXES):
        return False
    if not first_line.startswith(b"#!"):
        return True
    words = [PurePosixPath(word).name for word in first_line[2:].decode("utf-8", "replace").split()]
    # `/usr/bin/env [-S] [-u NAME] [NAME=value] python3 -u`: env's own words come before the program's
    named = words[1:] if words[:1] == ["env"] else words[:1]
    return any(_PYTHON_PROGRAM.fullmatch(word) for word in named)


def _first_line(full: Path) -> bytes:
    try:
        with open(full, "rb") as source:
            return source.readline(4096)
    except OSError:  # unreadable here: the hosts' copy will say so in Python's own words
        return b""


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
