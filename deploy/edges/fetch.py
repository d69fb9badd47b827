"""Bringing a run home: each host's run directory into `runs/<id>/hosts/<host>/`, and the newest
verified checkpoints into `runs/<id>/checkpoints/`.

A host may be compromised, so what it serves is data and never a path to follow. rsync brings
regular files only (no links, devices or specials; no owner, group or mode bits from the host)
into a staging tree, `.incoming/<host>/tree/`, where an interrupted transfer keeps its partial
files (`--partial-dir`) and resumes, and a killed one leaves its temp file in `tmp/`, outside the
tree. A host fetched before is fetched against what the last fetch placed from it
(`staging.fetch_basis`): only what changed on the host crosses the link. Checkpoints are
verified against the host's `MANIFEST.sha256` under the rules of `deploy.run.manifest` (the
trainer's own names only; other lines are reported, not acted on).
Each staged file is then placed (`deploy.edges.fetchplace`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from meshrun.fsutil import sha256_file
from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS, FETCH_LOCK, checkpoint_step, run_dir
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.edges.rsyncrun import RSYNC_VANISHED_EXIT, io_timeout_option, run_rsync
from meshrun.deploy.edges.staging import PARTIAL_DIR, Staging, is_regular, remove_tree, walk
from meshrun.deploy.edges.sync import PROGRESS_RE, PROTECT_ARGS, remote_path, remote_spec, ssh_argv
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.manifest import MANIFEST_MAX_BYTES, Manifest, parse_manifest, refusal_lines, shown
from meshrun.deploy.run.shell import local_workdir

SKIPPED_RE = re.compile(rb'^skipping non-regular file "(.*)"$')
REPORTED_SKIPS = 20
FETCH_TIMEOUT_S = 3600  # one host's whole transfer (checkpoints of a large model over a slow link)
# rsync hard-links an unchanged file from the basis (no byte read or written: a checkpoint of 10 GB
# was copied on every fetch) and builds a changed one from the basis's blocks and the differences.
BASIS_OPTION = "--link-dest="
RESUMES = "the transfer resumes where it stopped"  # a failed transfer's hint: its partial file stays in staging
FETCH_ATTEMPTS = 2  # transfers of a host whose checkpoints fail their checksum, before they are called damaged


@dataclass
class Skips:
    """What a fetch did not bring home for not being a regular file: the first REPORTED_SKIPS
    names and how many in all (a host can serve a million pipes)."""

    names: list[str] = field(default_factory=list)
    total: int = 0

    def add(self, name: str) -> None:
        self.total += 1
        if len(self.names) < REPORTED_SKIPS:
            self.names.append(name)


@dataclass
class FetchReport:
    host: str
    landed: Path
    new: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # differ from a local file; kept the local one
    corrupt: list[str] = field(default_factory=list)  # checksum mismatch; not kept
    newest_step: int = -1
    verified: dict[str, str] = field(default_factory=dict)  # checkpoint name -> sha256, checked this fetch
    refused: list[str] = field(default_factory=list)  # manifest lines and files not acted on, one line each
    skipped: Skips = field(default_factory=Skips)  # not regular files on the host: not brought home
    updated: list[str] = field(default_factory=list)  # replaced a local file: grown, ours, or --force
    kept_home: list[str] = field(default_factory=list)  # as conflicts, but in runs/<id>/ (the assembled checkpoints/)
    placed: dict[str, str] = field(default_factory=dict)  # relative name -> sha256 of what is here now as the host sent it
    claimed: dict[str, str] = field(default_factory=dict)  # the host's manifest as it came (unverified: files may not)


# What one transfer brings of a host's run directory (rsync filter rules, first match wins; a
# partial dir the host serves is never taken, which rsync's own rule for it, added after these, would not hold).
EVERYTHING: tuple[str, ...] = ()
BUT_CHECKPOINTS = (f"--include=/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}", f"--exclude=/{CHECKPOINTS}/*")
ONLY_CHECKPOINTS = (f"--exclude={PARTIAL_DIR}/", f"--include=/{CHECKPOINTS}/", f"--include=/{CHECKPOINTS}/**", "--exclude=*")


def fetch_argv(host: Host, run_id: str, staging: Staging, root: Path, known_hosts: Path | None,
               basis: Path | None = None, part: tuple[str, ...] = EVERYTHING) -> list[str]:
    """rsync the host's run directory (of it, what the `part` filter keeps) into the staging
    tree: regular files only, resumable. With `basis` (`fetch_basis`: the host's tree as the last
    fetch left it, absolute), a file unchanged there is linked from it here and a changed one (a
    log that grew) comes as its differences: without it, the emptied staging tree would make
    every fetch send every byte again. A staged link is only read, then unlinked (place() finds
    it unchanged: it is the file here); nothing writes into a staged file, rsync included (its
    changes land in a new file renamed over the name), so the file here is never written through it."""
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--recursive", "--times", "--no-links", "--no-devices",
            "--no-specials", "--chmod=D755,F644", f"--partial-dir={PARTIAL_DIR}", f"--temp-dir={staging.tmp}",
            "--info=progress2", "--no-inc-recursive", *part]
    if basis is not None:  # times to the nanosecond: a file rewritten within a second at its size is not "unchanged"
        argv += ["--modify-window=-1", f"{BASIS_OPTION}{basis}"]
    if host.is_local:
        source = f"{local_workdir(host.workdir, root) / run_dir(run_id)}/"
        return argv + [source, f"{staging.tree}/"]
    source = remote_spec(host.ssh_host, f"{remote_path(host.workdir)}/{run_dir(run_id)}/")
    return argv + ["-e", shlex.join(ssh_argv(host, known_hosts)), source, f"{staging.tree}/"]


def prepare_staging(staging: Staging) -> None:
    """An empty temp dir and a tree of directories and regular files only (a staging tree left
    by an older meshrun may hold links: rsync would write through them), none deeper than
    MAX_DEPTH. A tree that cannot be cleaned goes whole: the fetch starts afresh rather than
    fail here every time."""
    shutil.rmtree(staging.tmp, ignore_errors=True)  # rsync's temp files: one flat folder
    try:
        _clean_tree(staging.tree)
    except OSError:
        remove_tree(staging.tree)
    staging.tmp.mkdir(parents=True)
    staging.tree.mkdir(parents=True, exist_ok=True)


def _clean_tree(tree: Path) -> None:
    deep: list[Path] = []
    for here, _dirs, files in walk(tree, deep):
        for name in files:
            if not is_regular(here / name):
                (here / name).unlink()
    for folder in deep:
        remove_tree(folder)


def fetch_verified(argv: list[str], staging: Staging, report: FetchReport,
                   progress: Callable[[str, int], None]) -> None:
    """Transfer the host's run directory and verify its checkpoints. A live run may save while
    rsync reads (the manifest comes first, `best.pt` later, of the next save): a checkpoint that
    fails its checksum is fetched once more, with the manifest, before it is called damaged;
    without the basis, so a copy called damaged is the host's own bytes, not a file here that
    rsync's quick check took for the host's (the same size and time)."""
    for _ in range(FETCH_ATTEMPTS):
        report.skipped = transfer(argv, report.host, progress)
        report.corrupt, report.verified, report.refused = [], {}, []
        verify_checkpoints(staging.tree, report)
        if not report.corrupt:
            return
        argv = [a for a in argv if not a.startswith(BASIS_OPTION)]


def transfer(argv: list[str], host: str, progress: Callable[[str, int], None],
             timeout: float = FETCH_TIMEOUT_S) -> Skips:
    """Run the fetch rsync; returns what it skipped for not being a regular file. A file that
    vanished while rsync ran (a save the live trainer pruned) is not an error: it is not home."""
    skipped = Skips()
    # No promise that a retry works now: the host may be down for good (a lost rendezvous host).
    run_rsync(argv, host=host, what="fetch", timeout=timeout,
              hint=f"fetch again once the host answers; {RESUMES}",
              on_line=lambda line: _read_line(line, host, progress, skipped), success=(0, RSYNC_VANISHED_EXIT))
    progress(host, 100)
    return skipped


def _read_line(line: bytes, host: str, progress: Callable[[str, int], None], skipped: Skips) -> None:
    match = PROGRESS_RE.search(line + b" ")
    if match:
        progress(host, int(match.group(1)))
    found = SKIPPED_RE.match(line)
    if found:
        skipped.add(shown(found.group(1).decode("utf-8", "backslashreplace")))


def skip_lines(host: str, skipped: Skips) -> list[str]:
    """One report line per skipped item (at most REPORTED_SKIPS, then a count)."""
    lines = [f"host '{host}': {name} is not a regular file (a link, device or pipe); not brought home"
             for name in skipped.names]
    if skipped.total > len(skipped.names):
        lines.append(f"host '{host}': {skipped.total - len(skipped.names)} more non-regular files not brought home")
    return lines


def read_host_manifest(directory: Path) -> Manifest:
    """The checkpoints directory's manifest, read as data: a regular file, at most
    MANIFEST_MAX_BYTES (+1 to see that it is larger), else no entries."""
    path = directory / CHECKPOINT_MANIFEST
    if not is_regular(path):
        return Manifest((), ())
    with open(path, "rb") as handle:
        return parse_manifest(handle.read(MANIFEST_MAX_BYTES + 1))


def verify_checkpoints(tree: Path, report: FetchReport) -> None:
    """Check the staged checkpoints against the host's manifest: a listed file whose sha256
    differs is deleted from staging (corrupt); refused manifest lines are reported only."""
    directory = tree / CHECKPOINTS
    manifest = read_host_manifest(directory)
    report.claimed = manifest.digests()
    report.refused += refusal_lines(report.host, manifest, f"{CHECKPOINTS}/{CHECKPOINT_MANIFEST}")
    for name, digest in manifest.digests().items():
        path = directory / name  # a checkpoint name has no '/': it stays in the directory
        if not is_regular(path):
            continue
        if sha256_file(path) == digest:
            report.verified[name] = digest
        else:
            report.corrupt.append(f"{CHECKPOINTS}/{name}")
            path.unlink()
    steps = [checkpoint_step(name) for name in report.verified]
    report.newest_step = max((s for s in steps if s is not None), default=-1)


def remove_staging(staging: Staging) -> None:
    """The staged copy goes once placed; partial transfers stay so the next fetch resumes, and
    an emptied partial dir goes with the rest. Folders deeper than MAX_DEPTH go whole. A tree
    that cannot be emptied goes whole, partials with it: a retransfer, never a stuck fetch."""
    shutil.rmtree(staging.tmp, ignore_errors=True)
    try:
        _empty_tree(staging.tree)
    except OSError:
        remove_tree(staging.tree)
    if staging.root.is_dir() and not any(staging.root.iterdir()):
        staging.root.rmdir()


def _empty_tree(tree: Path) -> None:
    folders: list[Path] = []  # parents before children: emptied in reverse
    deep: list[Path] = []
    for here, dirs, files in walk(tree, deep):
        for name in files:
            (here / name).unlink()
        folders += [here] + [here / d for d in dirs if d == PARTIAL_DIR]
        dirs[:] = [d for d in dirs if d != PARTIAL_DIR]
    for folder in deep:
        remove_tree(folder)
    for folder in reversed(folders):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


@contextmanager
def fetch_lock(home: Path, run_id: str) -> Iterator[None]:
    """One fetch of a run at a time into `home` (its folder in a runs dir): two share its staging
    tree, and one's clean-up removed what the other was still hashing or placing. The flock is
    held for the whole fetch, our pid written in it, and goes with this process however it ends.
    A second fetch is one line naming the first's pid."""
    path = home / FETCH_LOCK
    try:
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise MeshrunError(with_path("cannot open the fetch lock ", path, f" ({err.strerror or err}); make its "
                                     "folder writable, or fetch elsewhere with --dest DIR")) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            words = os.read(fd, 32).split()
            pid = f" (pid {words[0].decode()})" if words and words[0].isdigit() else ""
            raise MeshrunError(f"another fab fetch-checkpoints of run {run_id} is running{pid}; wait for it "
                               "to end, then fetch again if you need to") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
