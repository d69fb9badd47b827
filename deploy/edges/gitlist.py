"""The files git lists in the project, and in every git repository inside it (deploy/edges/sync.py `project_files`).

git lists a repository inside the project as one entry, `sub` (a submodule) or `sub/` (an untracked clone),
which rsync would send as an empty folder or with its top level unfiltered (its SSH keys too): each is
listed by its own git instead, its files private by their names from its top as well as from the project's.

Such a repository need not be the user's. `fab fetch-checkpoints` places any regular file a host served
(`x/.git/config` too) under the runs folder, and an unpacked archive or a `--dest` inside the project may
hold one anywhere. git runs what a repository's own config says even for `ls-files` (git(1), "SECURITY"):
`core.fsmonitor`'s hook at each index read, and, to fetch the trees a sparse index lacks, a promisor
remote's transport (`remote.<name>.uploadpack`, `core.sshCommand`, `ext::`, a `remote.<name>.vcs` helper
that an `alias.remote-<vcs>` makes a shell command). So:

- a folder whose every file stays home anyway (under `runs/`, the runs folder in use, a local workdir's
  copy: `syncset.kept_home`) is never entered: no git runs there, and nothing there can fail the sync;
- every other nested git is pinned to its folder and runs nothing (`nested_argv`, `nested_env`);
- what it lists is its index's say, not the user's: a name leaving its folder (`../x`, `/x`, through a
  link) is dropped (`_inside`).
"""

from __future__ import annotations

import os
import posixpath
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.syncset import clean_name, kept_home, shippable

GIT_TIMEOUT_S = 120  # `git ls-files` of a large project on a slow disk
NESTED_MAX, NESTED_DEPTH = 256, 8  # git repositories inside the project (clones, submodules, theirs) listed, at most
# `-c` is the command scope, which wins over the repository's own config and whatever it includes (git-config(1),
# "SCOPES"). `core.fsmonitor=` (empty, not `false`): git up to 2.35.1 runs `false` as the hook; empty is off in
# every version. No hook runs (ls-files runs none; a later git's index write might). The untracked cache is the
# index's data: the folder's own files are read instead. core.excludesFile and include.path stay: they only read
# a file (patterns that hide this repository's own files, more config that `-c` still overrides).
NESTED_CONFIG = ("core.fsmonitor=", "core.hooksPath=/dev/null", "core.untrackedCache=false")
# GIT_ALLOW_PROTOCOL overrides every `protocol.<name>.allow`, the repository's `protocol.file.allow=always` too
# (`-c protocol.allow=never` does not: the named key wins). Its one name starts with `-`: no URL scheme or
# helper can (an empty list would allow helper "", a `::x` URL's). GIT_NO_LAZY_FETCH: git 2.45 (and the 2.39.4+
# security releases) fetches nothing at all.
NESTED_ENV = {"GIT_ALLOW_PROTOCOL": "-none-", "GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0"}
# The user's environment naming another repository, index or object store: not this folder's.
REPOSITORY_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY",
                  "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_IMPLICIT_WORK_TREE", "GIT_NAMESPACE", "GIT_PREFIX")
LS_FILES = ("ls-files", "-z", "--cached", "--others", "--exclude-standard")


@dataclass
class _Walk:
    root: Path
    folders: frozenset[str]  # project-relative folders whose files all stay home (`shippable`'s)
    count: int = 0  # nested repositories entered so far
    seen: dict[str, bool] = field(default_factory=dict)  # a folder (absolute) lies inside its repository's top


def repository_files(root: Path, folders: frozenset[str] = frozenset()) -> list[str]:
    """The files git lists in the project at `root` and in each repository inside it, relative to `root`;
    `folders` (relative): never entered, their files staying home."""
    return _listed(_Walk(root, folders), ())


def _listed(walk: _Walk, tops: tuple[str, ...]) -> list[str]:
    """The files of the repository at `tops[-1]` (project-relative; the project's own when `tops` is empty),
    relative to it. A folder git lists is a repository: it is judged before it is entered."""
    at = tops[-1] if tops else ""
    top = walk.root / at if at else walk.root
    found: list[str] = []
    real = os.path.realpath(top)
    for listed in ls_files(top, nested=bool(tops)):
        name = listed.rstrip("/")
        if tops and not _inside(walk, real, name):
            continue
        path = top / name
        try:
            mode = os.lstat(path).st_mode  # a link is sent as a link, its target anywhere (on the hosts only, say)
        except OSError:
            continue  # a tracked file deleted since is still listed; rsync would fail on it
        if not stat.S_ISDIR(mode):
            found.append(name)
            continue
        # A repository: git lists no other folder. Judged before git runs in it; a folder without `.git` is a
        # submodule not checked out, or a tracked file's now a folder (meshrun sends files, never a folder).
        inner = f"{at}/{name}" if at else name
        if not kept_home(inner, tops, walk.folders) and os.path.lexists(path / ".git"):
            walk.count += 1
            if len(tops) >= NESTED_DEPTH or walk.count > NESTED_MAX:
                raise MeshrunError(f"{path}: more git repositories inside the project than meshrun lists "
                                   f"({NESTED_MAX}, {NESTED_DEPTH} deep at most); add those hosts need not get to "
                                   ".gitignore")
            found += (f"{name}/{n}" for n in _listed(walk, (*tops, inner)))
    return shippable(found, frozenset()) if tops else found


def _inside(walk: _Walk, real: str, name: str) -> bool:
    """Does `name`, as a nested repository's git lists it, lie in its folder (`real`, links resolved): no `..`,
    `/` or empty part, every folder on the way a folder there, not a link? git never lists such a name, but
    the index is written by whoever wrote the folder, and git reads it unchecked."""
    if not clean_name(os.fsencode(name)):
        return False
    parent = posixpath.dirname(name)
    if not parent:
        return True
    folder = os.path.join(real, parent)
    if folder not in walk.seen:
        walk.seen[folder] = os.path.realpath(folder) == folder
    return walk.seen[folder]


def nested_argv() -> list[str]:
    """`git ls-files` of the repository in the current folder, pinned to it: its `.git` and no other
    (no search above or beside it), this folder its work tree (a `core.worktree` could name `/`)."""
    config = [arg for pair in NESTED_CONFIG for arg in ("-c", pair)]
    return ["git", "--no-pager", "--git-dir=.git", "--work-tree=.", *config, *LS_FILES]


def nested_env(environ: dict[str, str]) -> dict[str, str]:
    """The nested git's environment: the user's, less what names another repository, plus NESTED_ENV."""
    return {**{k: v for k, v in environ.items() if k not in REPOSITORY_ENV}, **NESTED_ENV}


def ls_files(top: Path, *, nested: bool) -> list[str]:
    """`git ls-files` of the repository at `top`. A nested one's git reads nothing from the terminal: no
    stdin, and a session of its own, without one (an `include.path` of /dev/tty would wait on the user)."""
    argv, env = (nested_argv(), nested_env(dict(os.environ))) if nested else (["git", *LS_FILES], None)
    try:
        done = subprocess.run(argv, cwd=top, capture_output=True, check=True, timeout=GIT_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL, start_new_session=nested)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        if nested:
            raise MeshrunError(f"{top}: a git repository inside the project whose files git cannot list ({err}); "
                               "add it to .gitignore, or mend it") from None
        raise MeshrunError(f"{top}: cannot list the project's files with git ({err}); "
                           "meshrun syncs a git checkout: run it from the repository") from None
    return [os.fsdecode(n) for n in done.stdout.split(b"\0") if n]
