"""Code sync: rsync the project's git-tracked and untracked-but-not-ignored files to each host.

Planning (file list, rsync and ssh argv) is pure; `sync_host` runs rsync and reports progress.
The ssh that rsync uses checks host keys exactly like the controller: the inventory's
known_hosts plus the system one, StrictHostKeyChecking=yes, never a prompt. Every rsync here and
in `datasync`/`fetch` sends its paths through rsync's protocol (`PROTECT_ARGS`), never through
the remote shell's command line, and names the host with `remote_spec` (IPv6 in brackets).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sshargv import ssh_argv  # the ssh rsync runs: same hops, keys and host keys as paramiko
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.shell import local_workdir, make_workdir
from meshrun.deploy.run.syncset import shippable

# The remote shell never sees a path or option value; rsync >= 3.0 on both ends knows this name
# (3.2.7 renamed it --secluded-args and keeps this one as its alias).
PROTECT_ARGS = "--protect-args"
PROGRESS_RE = re.compile(rb"\s(\d{1,3})%\s")
GIT_TIMEOUT_S = 120  # `git ls-files` of a large project on a slow disk


@dataclass(frozen=True)
class SyncResult:
    host: str
    skipped: bool  # a local host whose workdir is the project itself
    files: int
    seconds: float = 0.0
    unchanged: bool = False  # asked first, it held this very code: nothing sent (deploy/run/codehint.py)


def project_files(root: Path, private: tuple[Path, ...] = (), private_dirs: tuple[Path, ...] = ()) -> bytes:
    """NUL-separated paths of tracked and untracked-not-ignored files (rsync --files-from --from0),
    less inventories and SSH files (`deploy/run/syncset.py`), the `private` files given (the
    inventory in use, its known_hosts and identity files) and all under the `private_dirs` (the
    runs folder in use)."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                              capture_output=True, check=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        raise MeshrunError(f"{root}: cannot list the project's files with git ({err}); "
                           "meshrun syncs a git checkout: run it from the repository") from None
    # Deleted-but-tracked files are still listed by git; rsync would fail on them.
    names = [os.fsdecode(n) for n in done.stdout.split(b"\0") if n and (root / os.fsdecode(n)).exists()]
    named = frozenset(_relative(p, root) for p in private)
    folders = frozenset(_relative(p, root) for p in private_dirs)
    return b"".join(os.fsencode(n) + b"\0" for n in shippable(names, named, folders))


def _relative(path: Path, root: Path) -> str:
    """`path` as git names it under `root` ("" when it lies outside: nothing to leave out)."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(root)).as_posix()
    except ValueError:
        return ""


def remote_path(workdir: str) -> str:
    """rsync's remote paths are relative to the login home, so `~/x` becomes `x`."""
    if workdir == "~":
        return "."
    return workdir[2:] if workdir.startswith("~/") else workdir


def remote_spec(address: str, path: str) -> str:
    """rsync's `HOST:PATH`. An IPv6 address goes in brackets: bare, its colons would make rsync
    read `fd00::1:x` as host `fd00` and a `::` daemon module."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{path}"


def rsync_argv(host: Host, root: Path, known_hosts: Path | None, dest: str | None = None) -> list[str]:
    """Copy the files listed on stdin from `root` to the host's workdir (or `dest` there)."""
    target = dest if dest is not None else remote_path(host.workdir)
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--archive", "--compress", "--mkpath", "--files-from=-",
            "--from0", "--info=progress2", "--no-inc-recursive"]
    if host.is_local:
        return argv + [f"{root}/", f"{target}/"]
    # The workdir is made before the remote rsync looks at it: `fab train` runs commands beside the
    # sync that may make it too (deploy/commands/train.py), and rsync's own mkdir of a destination it
    # found missing fails if another makes it between rsync's stat and its mkdir. `mkdir -p` does not.
    made = ["--rsync-path", f"{make_workdir(host.workdir)} && rsync"] if dest is None else []
    # rsync splits -e itself and honours quotes, so a shlex-joined argv survives.
    return argv + [*made, "-e", shlex.join(ssh_argv(host, known_hosts)), f"{root}/",
                   remote_spec(host.ssh_host, f"{target}/")]


def is_project_itself(host: Host, root: Path) -> bool:
    return host.is_local and local_workdir(host.workdir, root).resolve() == root.resolve()


def sync_host(host: Host, root: Path, known_hosts: Path | None, files: bytes,
              progress: Callable[[str, int], None], timeout: float) -> SyncResult:
    """rsync the listed files to `host` within `timeout` s; `progress(host, percent)` as rsync reports it."""
    count = files.count(b"\0")
    if is_project_itself(host, root):
        return SyncResult(host.name, True, count)
    if host.is_local:  # made before rsync looks, as rsync_argv's --rsync-path does on a remote host
        local_workdir(host.workdir, root).mkdir(parents=True, exist_ok=True)
    argv = rsync_argv(host, root, known_hosts,
                      str(local_workdir(host.workdir, root)) if host.is_local else None)

    def on_line(line: bytes) -> None:
        for match in PROGRESS_RE.finditer(line + b" "):
            progress(host.name, int(match.group(1)))

    run_rsync(argv, host=host.name, what="code sync", timeout=timeout, stdin=files, on_line=on_line,
              hint=f"check `fab check-network --hosts {host.name}`")
    progress(host.name, 100)
    return SyncResult(host.name, False, count)


def push_dir_argv(host: Host, local_dir: Path, dest: str, root: Path, known_hosts: Path | None,
                  leave_out: tuple[str, ...] = ()) -> list[str]:
    """rsync a local directory to `dest` (relative to the host's workdir), never replacing files there;
    regular files only (the folder may hold what hosts sent: links would point into this machine),
    less the files `leave_out` names at its top. No --inplace or --partial: a file cut mid-transfer
    is rsync's temp file, never one under its final name."""
    return _push_argv(host, local_dir, dest, root, known_hosts, [f"--exclude=/{name}" for name in leave_out])


def push_named_argv(host: Host, local_dir: Path, names: tuple[str, ...], dest: str, root: Path,
                    known_hosts: Path | None) -> list[str]:
    """`push_dir_argv`'s transfer of only the files `names` names at the folder's top (a resume's
    newest checkpoint and best.pt, not every step a home folder gathered over weeks of fetches).
    Each name is one anchored include, everything else excluded: a name with a wildcard, a
    backslash or a `/` would match more than itself, so it is refused (the trainer's names have none)."""
    odd = [name for name in names if not name or any(c in name for c in "*?[\\/")]
    if odd:
        raise ValueError(f"not a plain file name for an rsync include: {odd!r}")
    return _push_argv(host, local_dir, dest, root, known_hosts,
                      [*(f"--include=/{name}" for name in names), "--exclude=*"])


def _push_argv(host: Host, local_dir: Path, dest: str, root: Path, known_hosts: Path | None,
               filters: list[str]) -> list[str]:
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--archive", "--no-links", "--no-devices", "--no-specials",
            "--mkpath", "--ignore-existing", *filters]
    if host.is_local:
        return argv + [f"{local_dir}/", f"{local_workdir(host.workdir, root) / dest}/"]
    target = f"{remote_path(host.workdir)}/{dest}"
    return argv + ["-e", shlex.join(ssh_argv(host, known_hosts)), f"{local_dir}/",
                   remote_spec(host.ssh_host, f"{target}/")]
