"""Code sync: rsync the project's git-tracked and untracked-but-not-ignored files to each host.

Planning (file list, rsync and ssh argv) is pure; `sync_host` runs rsync and reports progress.
The ssh that rsync uses checks host keys exactly like the controller: the inventory's
known_hosts plus the system one, StrictHostKeyChecking=yes, never a prompt. Every rsync here and
in `datasync`/`fetch` sends its paths through rsync's protocol (`PROTECT_ARGS`), never through
the remote shell's command line, and names the host with `remote_spec` (IPv6 in brackets).

A workdir holds more than the code (a venv, runs, data), so a sync deletes nothing it did not send:
it sends its list of names with the code (SHIPPED_NEW, in the same rsync: `sent_list`), and once
rsync succeeded the names the workdir's record (SHIPPED_LIST) holds and this list lacks are removed
there (`PRUNE_SH`: a renamed module's old copy would shadow the new one), and the list is the record.

One workdir holds one project's code. Every project's hosts default to the same `~/meshrun`, and
a second project's sync would replace the first one's files under its running run (and leave its
own to shadow them). So the first sync leaves an owner mark in the workdir
(`common/layout.py` WORKDIR_OWNER: the project's id and its directory name), and a sync whose
project is not the one the mark names is refused in one line. The claim (make the mark when there
is none, else compare it) runs in the command rsync's ssh already starts (`--rsync-path`), so it
costs no round trip; a local host's workdir is claimed here. A workdir in the project itself (the
local default `.`) is the project's by construction and is never marked. A project is its
repository's (`project_ids`): every clone, worktree and machine's checkout of it shares the id.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import posixpath
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from meshrun.layout import AGENT_LOCKS, WORKDIR_OWNER
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.gitlist import GIT_TIMEOUT_S, repository_files
from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sshargv import ssh_argv  # the ssh rsync runs: same hops, keys and host keys as paramiko
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.host import setup as host_setup
from meshrun.deploy.host.codestat import MARK_MAX, is_ours, mark_line, record_of
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.answers import network_hint
from meshrun.deploy.run.dataplan import PARTIAL_DIR
from meshrun.deploy.run.shell import local_workdir, make_workdir, shell_path
from meshrun.deploy.run.syncbusy import busy_guard, guard_said
from meshrun.deploy.run.syncset import (  # noqa: F401 (the owner mark's names, here too for callers and tests)
    NAME_RE, OWNER_SAID, PRUNE_SH, SAID_RE, SHIPPED_NEW, WORKDIR_FILES, Claim, WorkdirTaken, mark_name, new_workdir,
    relative_name, remote_path, remote_spec, sent_list, shippable, taken_message)

# The remote shell never sees a path or option value; rsync >= 3.0 knows this name (3.2.7's --secluded-args alias).
PROTECT_ARGS = "--protect-args"
PROGRESS_RE = re.compile(rb"\s(\d{1,3})%\s")
PRUNE_TIMEOUT_S = 120  # a local workdir's removal of what the project no longer has (PRUNE_SH)
PROJECT_ID_FILE = "meshrun-project-id"  # in the git dir: a random id, for a repository with no commit to name it
OWNER_EXIT = 97  # the claim's exit status then
OWNER_TIMEOUT_S = 60  # the data sync's claim, one short command over its open session
# The claim, run by `sh -c` on the host with the mark's path, this project's id, its mark line and this checkout's
# earlier ids (`Claim.also`): the mark is made whole when there is none (written aside, then linked: of two first
# syncs at once, one makes it, and neither reads it half written), then its first line is compared, never run; one
# naming an earlier id is this project's, rewritten (aside, then renamed over it); another project's is said on
# stderr in printable ASCII only. A mark that cannot be made is rsync's to say. One line: the login shell hands it on.
CLAIM_SH = ('m=$1; [ -e "$m" ] || [ -L "$m" ] || { t="$m.$$"; printf \'%s\\n\' "$3" > "$t" && '
            '{ ln "$t" "$m" || (set -C; cat "$t" > "$m"); }; rm -f "$t"; } 2>/dev/null; '
            '[ -e "$m" ] || [ -L "$m" ] || exit 0; o=; '
            f'[ -f "$m" ] && o=$(head -c {MARK_MAX} "$m" | head -n 1); case "$o" in "$2"|"$2 "*) exit 0;; esac; '
            'n=$3; shift 3; for i in "$@"; do case "$o" in "$i"|"$i "*) t="$m.$$"; '
            '{ printf \'%s\\n\' "$n" > "$t" && mv -f "$t" "$m"; rm -f "$t"; } 2>/dev/null; exit 0;; esac; done; '
            f'printf \'%s %s\\n\' {OWNER_SAID} "$o" | tr -cd \'\\040-\\176\\n\' >&2; exit {OWNER_EXIT}')


def busy_test_argv(python: str) -> list[str]:
    """`fab setup`'s host-side test alone, run by `python`: whether a run's agent holds its lock in the
    workdir (deploy/host/setup.py `--check-only`). Setup, `fab sync` and every code sync's guard ask it."""
    return probe_argv(python, "setup", "--check-only", "--agent-locks", AGENT_LOCKS)


class RunsBusy(MeshrunError):
    """A code sync refused before its rsync: a run runs from the host's workdir (`runs`, as its answer
    names them; () when it said so in other words). Nothing was sent to that host."""

    def __init__(self, host: str, runs: tuple[str, ...]) -> None:
        super().__init__(f"host '{host}': a run is running from its workdir ({', '.join(runs) or 'unnamed'}); "
                         "nothing was synced there")
        self.host, self.runs = host, runs


@dataclass(frozen=True)
class SyncResult:
    host: str
    skipped: bool  # a local host whose workdir is the project itself
    files: int
    seconds: float = 0.0
    unchanged: bool = False  # asked first, it held this very code: nothing sent (deploy/run/codehint.py)


def project_files(root: Path, private: tuple[Path, ...] = (), private_dirs: tuple[Path, ...] = ()) -> bytes:
    """NUL-separated paths of tracked and untracked-not-ignored files (rsync --files-from --from0),
    those of every git repository inside the project too (`gitlist.repository_files`), less inventories and
    SSH files (`deploy/run/syncset.py`), the `private` files given (the inventory in use, its
    known_hosts and identity files), all under the `private_dirs` (the runs folder in use) and
    meshrun's own files of a workdir's top (WORKDIR_FILES)."""
    named = frozenset(relative_name(p, root) for p in private)
    folders = frozenset(relative_name(p, root) for p in private_dirs)
    names = sorted(set(repository_files(root, folders)), key=os.fsencode)  # never entering `folders`
    shipped = [n for n in shippable(names, named, folders) if n not in WORKDIR_FILES]
    return b"".join(os.fsencode(n) + b"\0" for n in shipped)


def rsync_argv(host: Host, root: Path, known_hosts: Path | None, dest: str | None = None,
               claim: Claim | None = None, *, recorded: bool = False, guard: str | None = None) -> list[str]:
    """Copy the files listed on stdin from `root` to the host's workdir (or `dest` there); with
    `claim` (the code sync to a remote host), the workdir is claimed for the project first, and with
    `guard` (syncbusy.busy_guard), that shell command runs in the workdir before that: its failure
    ends the sync before the claim and rsync. With `recorded` (the code sync), the list is `sent_list`'s, from `/`,
    and on a remote host its rsync is followed by PRUNE_SH in the workdir (a local one's is run here:
    `sync_host`)."""
    target = dest if dest is not None else remote_path(host.workdir)
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--archive", "--compress", "--mkpath", "--files-from=-",
            "--from0", "--info=progress2", "--no-inc-recursive"]
    argv += [f"--partial-dir={PARTIAL_DIR}"] if recorded else []  # a big code file cut by the deadline resumes
    source = "/" if recorded else f"{root}/"
    if host.is_local:
        return argv + [source, f"{target}/"]
    # The workdir is made before the remote rsync looks at it: `fab train` runs commands beside the
    # sync that may make it too (deploy/commands/train.py), and rsync's own mkdir of a destination it
    # found missing fails if another makes it between rsync's stat and its mkdir. `mkdir -p` does not.
    # The guard first, in a subshell (the cwd kept): a workdir a run runs from gets not a byte, not even a mark.
    claimed = f" && (cd {shell_path(host.workdir)} && {guard})" if guard is not None else ""
    claimed += f" && {claim_command(host.workdir, claim)}" if claim is not None else ""
    # The prune runs after rsync, in the same command (rsync's arguments follow: `sh -c` takes them as "$@"),
    # and only once it succeeded; its own trouble never fails the sync (rsync's exit is the command's).
    pruned = f'rsync "$@" || exit; cd {shell_path(host.workdir)} && ({PRUNE_SH}); exit 0'
    then = f"sh -c {shlex.quote(pruned)} meshrun-sync" if recorded else "rsync"
    made = ["--rsync-path", f"{make_workdir(host.workdir)}{claimed} && {then}"] if dest is None else []
    # rsync splits -e itself and honours quotes, so a shlex-joined argv survives.
    return argv + [*made, "-e", shlex.join(ssh_argv(host, known_hosts)), source,
                   remote_spec(host.ssh_host, f"{target}/")]


def is_project_itself(host: Host, root: Path) -> bool:
    return host.is_local and local_workdir(host.workdir, root).resolve() == root.resolve()


def in_project(host: Host, root: Path) -> bool:
    """A local host whose workdir is the project or a folder of it: the project's alone, never marked."""
    if not host.is_local:
        return False
    return local_workdir(host.workdir, root).resolve().is_relative_to(root.resolve())


def sync_host(host: Host, root: Path, known_hosts: Path | None, files: bytes,
              progress: Callable[[str, int], None], timeout: float, *, claim: Claim | None = None,
              python: str | None = None) -> SyncResult:
    """rsync the listed files to `host` within `timeout` s; `progress(host, percent)` as rsync reports it.
    With `claim`, a workdir another project's sync marked is WorkdirTaken, and nothing is sent. With
    `python` (the runs' interpreter there), a workdir a run runs from is RunsBusy, and nothing is sent:
    asked in the same command as the rsync (no round trip more), so a sync beside `fab train`'s connect
    never changes the code under another run, whatever else that train then refuses."""
    count = files.count(b"\0")
    if is_project_itself(host, root):
        return SyncResult(host.name, True, count)
    claim = None if claim is None or in_project(host, root) else claim
    if host.is_local:  # made before rsync looks, as rsync_argv's --rsync-path does on a remote host
        workdir = local_workdir(host.workdir, root)
        workdir.mkdir(parents=True, exist_ok=True)
        if python is not None and (held := host_setup.running_agents(f"{glob.escape(str(workdir))}/{AGENT_LOCKS}")):
            raise RunsBusy(host.name, tuple(dict.fromkeys(run for run, _, _ in held)))
        if claim is not None and (found := claim_local(workdir, claim)) is not None:
            raise WorkdirTaken(host.name, host.workdir, mark_name(found), claim)
    dest = str(local_workdir(host.workdir, root)) if host.is_local else None

    def on_line(line: bytes) -> None:
        for match in PROGRESS_RE.finditer(line + b" "):
            progress(host.name, int(match.group(1)))

    with staged_record(files) as staged:
        guard = None if host.is_local or python is None else busy_guard(busy_test_argv(python))
        argv = rsync_argv(host, root, known_hosts, dest, None if host.is_local else claim, recorded=True, guard=guard)
        try:
            run_rsync(argv, host=host.name, what="code sync", timeout=timeout, on_line=on_line,
                      stdin=sent_list(os.fsencode(os.path.abspath(root)), files, os.fsencode(staged)),
                      hint=network_hint(host.name))
        except MeshrunError as err:
            said = SAID_RE.search(str(err)) if claim is not None else None
            if said is not None:
                raise WorkdirTaken(host.name, host.workdir, said.group(1), claim) from None  # type: ignore[arg-type]
            if guard is not None and (runs := guard_said(str(err))) is not None:
                raise RunsBusy(host.name, runs) from None
            raise
    if dest is not None:  # a remote host's ran in rsync's own command (`rsync_argv`)
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # left in the record: removed next time
            subprocess.run(["sh", "-c", PRUNE_SH], cwd=dest, capture_output=True, timeout=PRUNE_TIMEOUT_S)
    progress(host.name, 100)
    return SyncResult(host.name, False, count)


@contextlib.contextmanager
def staged_record(files: bytes) -> Iterator[str]:
    """This sync's record (codestat `record_of`) as a file named SHIPPED_NEW, for rsync to send with the
    code, in a private temporary folder (mode 0700) removed after."""
    folder, record = None, record_of([n for n in files.split(b"\0") if n])
    # Its time is its content's: rsync's quick check (size and time) then never takes another list that a
    # failed sync left on the host for this one.
    stamp = 10**9 + int.from_bytes(hashlib.sha256(record).digest()[:8], "big") % 10**9
    try:
        folder = tempfile.mkdtemp(prefix="meshrun-files-")
        with open(os.path.join(folder, SHIPPED_NEW), "xb") as handle:
            handle.write(record)
        os.utime(os.path.join(folder, SHIPPED_NEW), (stamp, stamp))
    except OSError as err:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise MeshrunError(f"cannot write the code sync's file list in a temporary folder: {err}") from None
    try:
        yield os.path.join(folder, SHIPPED_NEW)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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


def claim_argv(mark: str, claim: Claim) -> list[str]:
    """The claim of the workdir whose owner mark is at `mark` (as the host's shell reaches it)."""
    return ["sh", "-c", CLAIM_SH, "meshrun-claim", mark, claim.project_id, claim.mark, *claim.also]


def claim_command(workdir: str, claim: Claim) -> str:
    """`claim_argv` as one shell command run from the login directory (a leading `~/` is the home)."""
    mark = shell_path(posixpath.join(workdir, WORKDIR_OWNER))
    return " ".join(mark if n == 4 else shlex.quote(a) for n, a in enumerate(claim_argv("", claim)))


def claim_local(workdir: Path, claim: Claim) -> bytes | None:
    """The claim on this machine (as CLAIM_SH: made whole when there is none, rewritten when it names
    an earlier id of this checkout); None when the workdir is this project's, else the mark's first line."""
    path = workdir / WORKDIR_OWNER
    try:
        made = _make_whole(path, claim.mark)
    except OSError:
        return None  # an unwritable workdir: rsync says why
    found = mark_line(str(path)) if not made else None
    if made or is_ours(found, claim.project_id):
        return None
    if any(is_ours(found, earlier) for earlier in claim.also):
        with contextlib.suppress(OSError):  # else left as it is: still accepted, and rewritten next time
            _make_whole(path, claim.mark, replace=True)
        return None
    return found or b""


def _make_whole(path: Path, text: str, *, replace: bool = False) -> bool:
    """`path` holding `text` and a newline, made only when there is none (or over it, `replace`), never
    seen half written (written aside, then linked or renamed); False when one was there."""
    if os.path.lexists(path) and not replace:
        return False
    aside = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(aside, "x", encoding="ascii") as handle:
            handle.write(text + "\n")
        if replace:
            os.replace(aside, path)
            return True
        try:
            os.link(aside, path)
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system: made in place, as CLAIM_SH does then
            with open(path, "x", encoding="ascii") as handle:
                handle.write(text + "\n")
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)
    return True


def check_owner(host: Host, session: Session, root: Path, claim: Claim) -> None:
    """The claim over a session already open, for the data sync (its rsync runs no command of ours):
    a workdir another project marked is WorkdirTaken before anything is sent there."""
    if in_project(host, root):
        return
    if host.is_local:
        workdir = local_workdir(host.workdir, root)
        workdir.mkdir(parents=True, exist_ok=True)
        if (found := claim_local(workdir, claim)) is not None:
            raise WorkdirTaken(host.name, host.workdir, mark_name(found), claim)
        return
    result = session.run(claim_argv(WORKDIR_OWNER, claim), timeout=OWNER_TIMEOUT_S, create_workdir=True)
    said = SAID_RE.search(f"{result.stderr}\n{result.stdout}")
    if result.rc == OWNER_EXIT and said is not None:
        raise WorkdirTaken(host.name, host.workdir, said.group(1), claim)


def project_claim(root: Path, inventory: Path) -> Claim:
    """This project's claim: its ids (`project_ids`), its directory's name in NAME_RE's characters."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", root.resolve().name)[:64] or "project"
    project, also, shallow = project_ids(root)
    return Claim(project, name, str(inventory), also, shallow)


def project_ids(root: Path) -> tuple[str, tuple[str, ...], bool]:
    """(the id, earlier ids a mark may still name, whether shallow). The id: HEAD's first-parent root and the
    project's folder (shared by clones, kept by a merge of unrelated history; two projects of one repository
    are two). No root (no commit; shallow): a random id in the git dir, accepted after too; else the path."""
    try:
        done = subprocess.run(["git", "rev-parse", "--git-dir", "--show-prefix", "--is-shallow-repository"],
                              cwd=root, capture_output=True, check=True, timeout=GIT_TIMEOUT_S)
        git_dir, prefix, shallow = os.fsdecode(done.stdout).split("\n")[:3]
        kept = root / git_dir / PROJECT_ID_FILE
        roots = None if shallow == "true" else root_commits(root)
        every = roots and root_commits(root, every=True)
        earlier = _repository_id(kept, make=roots is None)  # made only while there is nothing else to name it
        if roots is None and not earlier:
            raise ValueError(f"{kept}: not an id")
    except (OSError, ValueError, subprocess.SubprocessError):
        return _hashed("path " + os.path.realpath(root), ""), (), False
    if roots is None:
        return _hashed(earlier, prefix), (), shallow == "true"
    also = ((_hashed(earlier, prefix),) if earlier else ()) + (  # an earlier meshrun's id after such a merge
        (_hashed("roots " + " ".join(every), prefix),) if every and every != roots else ())
    return _hashed("roots " + " ".join(roots), prefix), also, False


def root_commits(root: Path, *, every: bool = False) -> tuple[str, ...] | None:
    """HEAD's first-parent root (kept by any merge), or `every` root sorted; None before a commit. Bounded."""
    try:
        argv = ["git", "rev-list", "--max-parents=0", *(() if every else ("--first-parent",)), "HEAD", "--"]
        done = subprocess.run(argv, cwd=root, capture_output=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MeshrunError(f"{root}: git took over {GIT_TIMEOUT_S} s to find the repository's first commit "
                           "(meshrun's project id); run `git commit-graph write --reachable` there") from None
    found = tuple(sorted(os.fsdecode(done.stdout).split()))  # SHA-1 or SHA-256 names
    ok = done.returncode == 0 and found and all(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", c) for c in found)
    return found if ok else None


def _hashed(repository: str, prefix: str) -> str:
    return hashlib.sha256(f"{repository}\0{prefix}".encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _repository_id(path: Path, *, make: bool) -> str:
    """The random id in `path` ("" when none), made first when `make` (`_make_whole`: two read the one made)."""
    if make:
        _make_whole(path, secrets.token_hex(16))
    found = (mark_line(str(path)) or b"").decode("ascii", "replace")
    return found if re.fullmatch(r"[0-9a-f]{32}", found) else ""
