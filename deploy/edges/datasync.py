"""`fab sync --data SRC:DEST`: a dataset directory to every host, with a sha256 manifest.

rsync's quick check (size + mtime) skips unchanged files and its delta transfer sends only what
changed. The manifest (`.meshrun-manifest.sha256`, sha256sum format, at DEST on each host) then lets
each host verify what it holds: a file whose bytes differ while size and mtime match (bit rot,
a half-written copy) is caught, sent again with rsync's checksum comparison, and verified once
more. Local hashes are cached by (size, mtime) so an unchanged dataset is not re-read; a hash cut
short (Ctrl-C) keeps what it made, saved as it goes and on the way out.

SRC is the user's and is only ever read. The hash cache lives in the user's cache folder, keyed by
SRC's real path; the manifest is written to a private temporary folder and handed to rsync as a
second source, so it lands at DEST beside the data; its mtime comes from its bytes (`listing_mtime`),
so rsync's quick check never takes a new listing for the old one. A `MANIFEST.sha256` of the user's in SRC is a
data file like any other. Only a top-level `.meshrun-manifest.sha256` in SRC is refused: at DEST
the two would be one file. A `.meshrun-hash-cache.json` an older meshrun left in SRC is not data
and is never sent.

A transfer cut short (the sync's deadline, a dropped link) keeps what arrived in `.meshrun-partial/`
beside the file at DEST (`--partial-dir`), and the next sync resumes from it instead of from byte 0:
over a slow uplink a large shard could otherwise never arrive. rsync itself excludes that name
from what it sends, and removes the folder once the file is whole. Cut at its deadline, the line
says so: run the same command again and it resumes (deploy/run/dataplan.rehinted); a host whose
disk filled is named as such, not sent to check the network.

A file the previous sync sent that SRC no longer has is removed from DEST first (deploy/edges/
datastale.py): nothing else there is touched. When the manifest there lists the same names as the
new one (the host answers a digest of them over the session), there is nothing to remove, and the
old manifest is not fetched: a resync of an unchanged or edited dataset costs no extra transfer.
A link leaving SRC is sent as what it leads to, and its files are listed in the manifest (deploy/edges/datawalk.py); the result names each such link
and how many files went through it (`DataResult.links`), and a file behind one named like an SSH
key or an inventory stops the sync before anything is sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from stat import S_ISDIR
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import flag_path_stat
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.dataplan import DATA_MANIFEST, LEGACY_CACHE, PARTIAL_DIR, listing_size, network_hint, rehinted
from meshrun.deploy.edges.datastale import Stale, dest_path, remove_stale, same_names, stale_at_dest
from meshrun.deploy.edges.datawalk import Leaving, data_files, link_lines, unreadable, why
from meshrun.deploy.edges.preflightcache import cache_file
from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sync import PROTECT_ARGS, ssh_argv
from meshrun.deploy.edges.transport import Session
from meshrun.fsutil import FileRefused, atomic_write_json, not_regular, read_regular

CACHE_MAX = 256 << 20  # about a million files' hashes
SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class DataSpec:
    source: Path
    dest: str  # on each host: relative to its workdir, or absolute


@dataclass(frozen=True)
class DataResult:
    host: str
    files: int
    transferred: tuple[str, ...]
    repaired: tuple[str, ...]  # failed verification once, then sent again and verified
    removed: int = 0  # files the previous sync sent that SRC no longer has, removed from DEST
    # Each link leaving SRC, whose content was sent: `extra -> ../../.ssh: sent as its content (2 files)`.
    # The same for every host: SRC's, not this host's.
    links: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # warnings about this host's DEST, one line each (an old manifest not read)


class Manifest(dict[str, str]):
    """{relative path: sha256} of every file DEST will hold, and what the walk of SRC learned beside
    it: `links`, one line per link leaving SRC (datawalk.link_lines); `before`, the size of the
    listing of what SRC held at its previous build (its hash cache), which with the new listing's
    size bounds the old manifest a host may honestly hold (dataplan.old_bound)."""
    links: tuple[str, ...] = ()
    before: int = 0


def parse_data_flag(value: str) -> DataSpec:
    source, colon, dest = value.partition(":")
    if not colon or not source or not dest:
        raise InputError(f"--data '{value}': expected SRC:DEST, e.g. --data ~/datasets/cifar10:data/cifar10")
    path = Path(source).expanduser()
    found = flag_path_stat("--data", path)  # a name too long for the system is one line too
    if found is None or not S_ISDIR(found.st_mode):
        raise InputError(f"--data: {path} is not a directory; point SRC at the local dataset directory")
    if dest.startswith("~"):
        raise InputError(f"--data: DEST '{dest}' is relative to each host's workdir, or absolute; drop the ~")
    return DataSpec(path, dest)


def hash_cache_file(source: Path) -> Path:
    """Where the hashes of `source` are cached: the user's cache folder, one file per real path of
    SRC (two spellings of one folder share it), never inside SRC."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(source))).hexdigest()[:32]
    return cache_file().parent / "datasets" / f"{key}.json"


# While a long hash runs, its hashes so far are saved this often: a controller killed outright, or a
# Ctrl-C that ends the program while the data sync hashes beside the code sync (a daemon thread,
# deploy/edges/beside.py, never unwinds), then loses no more than this much hashing. And never
# sooner than SAVE_SPACING times the last save's own time: a huge cache is not rewritten over and over.
CACHE_SAVE_EVERY_S = 10.0
SAVE_SPACING = 10


def build_manifest(source: Path) -> Manifest:
    """{relative path: sha256} of every file under `source`, reusing cached hashes of unchanged files.
    Reads SRC only. A file that cannot be read, whose name a manifest line cannot hold, or that a link
    leaving SRC would send while named like a key, is one InputError naming it, before any hashing.
    Cut short (Ctrl-C, an unreadable file), the hashes made so far are saved with the cached ones, so
    the next build hashes only what is left."""
    cache = _HashCache(hash_cache_file(source), os.path.realpath(source))
    manifest = Manifest()
    through: dict[Leaving, int] = {}
    try:
        for rel, full, via in sorted(data_files(source), key=lambda found: found[0]):
            if via is not None:
                through[via] = through.get(via, 0) + 1
            try:
                stat = os.stat(full)
                manifest[rel] = cache.digest(rel, f"{stat.st_size}:{stat.st_mtime_ns}", lambda: _sha256(full))
            except OSError as err:
                raise unreadable(full, err) from None
    except BaseException:
        cache.save_partial()
        raise
    cache.save_whole()
    manifest.links, manifest.before = link_lines(through), listing_size(cache.old)
    return manifest


class _HashCache:
    """The cached hashes of one SRC (`old`) and this build's (`fresh`). A whole build saves `fresh`
    alone (files gone from SRC drop out); a partial save keeps `old` too, for the files not reached."""

    def __init__(self, path: Path, real: str) -> None:
        self.path, self.real = path, real
        self.old = _load_cache(path, real)
        self.fresh: dict[str, dict] = {}
        self.unsaved = 0  # hashes made since the last save
        self.saved_at, self.save_cost = time.monotonic(), 0.0

    def digest(self, rel: str, key: str, make: Callable[[], str]) -> str:
        """The file's cached hash while its size and mtime are unchanged, else `make()`'s; every
        CACHE_SAVE_EVERY_S of hashing, the work so far is saved."""
        cached = self.old.get(rel, {}).get(key)
        if isinstance(cached, str) and SHA256_RE.fullmatch(cached):
            digest = cached
        else:
            digest, self.unsaved = make(), self.unsaved + 1
        self.fresh[rel] = {key: digest}
        if self.unsaved and time.monotonic() - self.saved_at >= max(CACHE_SAVE_EVERY_S, SAVE_SPACING * self.save_cost):
            self.save_partial()
        return digest

    def save_partial(self) -> None:
        if self.unsaved:  # nothing hashed since the last save: the file on disk already holds it all
            self._save({**self.old, **self.fresh})

    def save_whole(self) -> None:
        self._save(self.fresh)

    def _save(self, hashes: dict[str, dict]) -> None:
        began = time.monotonic()
        _save_cache(self.path, self.real, hashes)
        self.saved_at = time.monotonic()
        self.save_cost, self.unsaved = self.saved_at - began, 0


def _sha256(path: str) -> str:
    # Non-blocking open and fstat on that same file: a FIFO swapped in after the walk is refused, not waited on.
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as handle:
        problem = not_regular(os.fstat(handle.fileno()).st_mode)
        if problem is not None:
            raise FileRefused(problem)
        sha = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _load_cache(path: Path, real: str) -> dict[str, dict]:
    """{name: {"size:mtime_ns": sha256}} cached for the source at `real`; {} when there is none or it
    cannot be used (any shape, a FIFO, another source's)."""
    try:
        record = json.loads(read_regular(path, CACHE_MAX))
    except (OSError, ValueError, RecursionError):
        return {}
    hashes = record.get("hashes") if isinstance(record, dict) and record.get("source") == real else None
    if not isinstance(hashes, dict) or not all(isinstance(v, dict) for v in hashes.values()):
        return {}
    return hashes


def _save_cache(path: Path, real: str, hashes: dict[str, dict]) -> None:
    """Never fatal: a cache that cannot be written costs the next sync its hashing, nothing else. Not
    written when the cache folder is inside SRC itself (`--data ~:...`): SRC is only ever read."""
    if _inside(path.parent, real):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"source": real, "hashes": hashes})
    except OSError:
        pass


def _inside(path: Path | str, real_dir: str) -> bool:
    real = os.path.realpath(path)
    return os.path.commonpath([real, real_dir]) == real_dir


def manifest_bytes(manifest: dict[str, str]) -> bytes:
    """sha256sum's format: `<sha256>  <name>` lines."""
    return "".join(f"{d}  {r}\n" for r, d in manifest.items()).encode("utf-8", "surrogateescape")


@contextlib.contextmanager
def staged_manifest(source: Path, manifest: dict[str, str]) -> Iterator[Path]:
    """The manifest as a file named DATA_MANIFEST, for rsync to send beside SRC's files. It is in a
    fresh private folder per call, so hosts synced side by side never share or race on one file,
    and it is gone afterwards; the folder is outside SRC (TMPDIR, else the user's cache folder)."""
    real = os.path.realpath(source)
    bases = [Path(tempfile.gettempdir()), cache_file().parent]
    base = next((b for b in bases if not _inside(b, real)), None)
    if base is None:
        raise InputError(with_path("--data: ", source, " holds both the temporary folder and meshrun's cache "
                                   "folder; set TMPDIR to a folder outside it"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="meshrun-manifest-", dir=base))  # mode 0700: this user's alone
    except OSError as err:
        raise MeshrunError(f"--data: cannot make a folder for the manifest in {base}: {why(err)}") from None
    try:
        try:
            listing = manifest_bytes(manifest)
            (folder / DATA_MANIFEST).write_bytes(listing)
            os.utime(folder / DATA_MANIFEST, (listing_mtime(listing),) * 2)
        except OSError as err:
            raise MeshrunError(f"--data: cannot write the manifest in {folder}: {why(err)}") from None
        yield folder / DATA_MANIFEST
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def listing_mtime(listing: bytes) -> int:
    """The staged manifest's mtime, in seconds, from its bytes: rsync's quick check compares size and
    whole seconds, and a new listing of the same size (an edited file's new hash) staged within the
    second of the last one would otherwise be skipped, leaving DEST verified against the old hashes.
    The same listing keeps its mtime, so an unchanged one is not sent again. A time in 2001-2035."""
    return 1_000_000_000 + int.from_bytes(hashlib.sha256(listing).digest()[:4], "big") % (1 << 30)


def rsync_data_argv(host: Host, spec: DataSpec, root: Path, known_hosts: Path | None, checksum: bool,
                    files: list[str] | None = None, listing: Path | None = None) -> list[str]:
    """rsync of SRC's files to DEST; with `listing` (the staged manifest) that file too, to DEST's top.
    The listing comes first: of two sources' files of one name rsync keeps the first, so meshrun's
    manifest is the one at DEST whatever SRC holds by then. A file cut short resumes (PARTIAL_DIR).
    A link leaving SRC is sent as what it leads to (a shard on a second disk, `train -> /mnt/nas/train`):
    as a link it would dangle on the hosts (`datawalk.data_files` lists its files, so they are verified)."""
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--archive", "--copy-unsafe-links", "--mkpath",
            "--itemize-changes", f"--partial-dir={PARTIAL_DIR}", "--exclude", LEGACY_CACHE]
    if checksum:
        argv.append("--checksum")
    if files is not None:
        argv += ["--files-from=-", "--from0"]
    sources = ([str(listing)] if listing is not None and files is None else []) + [f"{spec.source}/"]
    ssh = [] if host.is_local else ["-e", shlex.join(ssh_argv(host, known_hosts))]
    return argv + ssh + sources + [f"{dest_path(host, spec.dest, root)}/"]


def changed_file(line: str) -> str | None:
    """The file rsync sent, from one --itemize-changes line (`<f+++++++++ name` to a remote host,
    `>f...` for a local copy); None for other lines."""
    return line.split(" ", 1)[1] if line.startswith(("<f", ">f")) and " " in line else None


def _rsync(argv: list[str], host: str, spec: DataSpec, deadline: float, stdin: bytes | None = None) -> tuple[str, ...]:
    """Run one data rsync before `deadline`; the files it sent. Its failure's hint is the one that
    fits (dataplan.rehinted): cut at the deadline, it resumes; the host's disk full, it says so."""
    sent: list[str] = []

    def on_line(line: bytes) -> None:
        name = changed_file(line.decode(errors="replace"))
        if name is not None:
            sent.append(name)

    try:
        run_rsync(argv, host=host, what="data sync", timeout=_left(deadline), stdin=stdin, on_line=on_line,
                  hint=network_hint(host))
    except MeshrunError as err:
        raise MeshrunError(rehinted(str(err), host, str(spec.source), spec.dest), err.exit_code) from None
    return tuple(sent)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


# Runs on the host with its python: checks DEST against DEST/<argv[2]> (DATA_MANIFEST), prints failing names as JSON.
VERIFY = """
import hashlib, json, os, sys
os.chdir(sys.argv[1])
bad = []
for line in open(sys.argv[2], encoding="utf-8"):
    digest, _, name = line.rstrip("\\n").partition("  ")
    try:
        h = hashlib.sha256()
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        ok = h.hexdigest() == digest
    except OSError:
        ok = False
    if not ok:
        bad.append(name)
print(json.dumps(bad))
"""


def verify(session: Session, python: str, dest: str, manifest: dict[str, str], timeout: float) -> tuple[str, ...]:
    """The manifest's names the host says fail. Only those: the answer is the host's, and a name
    the manifest does not list (`../../.ssh/id_ed25519`, terminal escapes) must never become a
    file the controller sends or a line it prints."""
    result = session.run([python, "-c", VERIFY, dest, DATA_MANIFEST], timeout=timeout)
    try:
        answer = result.last_json()
    except (ValueError, IndexError):
        answer = None
    if not isinstance(answer, list):
        # said(): the host's words, one line (a newline there could print lines that look like other hosts')
        why = result.stderr.strip()[-200:] or f"exit status {result.rc}"
        raise MeshrunError(f"host '{session.host.name}': could not verify {dest}: {said(why)}")
    return listed_only(answer, manifest)


def listed_only(names: list[object], manifest: dict[str, str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for n in names if isinstance(n, str) and n in manifest))


def sync_data(host: Host, session: Session, python: str, spec: DataSpec, manifest: dict[str, str], root: Path,
              known_hosts: Path | None, timeout: float, same: bool | None = None) -> DataResult:
    """Remove what the previous sync sent that SRC no longer has, send what changed and the manifest,
    verify everything against it, resend and re-verify what fails; all of it within `timeout` s. The
    resend needs no manifest: DEST holds it by then. `same`: `same_names`' answer when the caller
    asked it already (beside another question), else it is asked here."""
    deadline = time.monotonic() + timeout
    before = manifest.before if isinstance(manifest, Manifest) else 0
    if same is None:
        same = same_names(session, python, spec.dest, manifest, deadline)
    with staged_manifest(spec.source, manifest) as listing:
        stale = Stale(()) if same else stale_at_dest(
            host, spec.dest, root, known_hosts, listing.parent / "previous", deadline, manifest,
            lambda name: os.path.lexists(os.path.join(spec.source, name)), max(os.path.getsize(listing), before))
        removed = remove_stale(session, python, spec.dest, stale.names, deadline) if stale.names else 0
        sent = _rsync(rsync_data_argv(host, spec, root, known_hosts, checksum=False, listing=listing), host.name,
                      spec, deadline)
    bad = verify(session, python, spec.dest, manifest, _left(deadline))
    if bad:
        files = b"\0".join(b.encode() for b in bad) + b"\0"
        _rsync(rsync_data_argv(host, spec, root, known_hosts, checksum=True, files=list(bad)), host.name, spec,
               deadline, files)
        still = verify(session, python, spec.dest, manifest, _left(deadline))
        if still:
            raise MeshrunError(f"host '{host.name}': data files still corrupt after a second transfer: "
                               f"{', '.join(still)}; check the host's disk")
    links = manifest.links if isinstance(manifest, Manifest) else ()
    return DataResult(host.name, len(manifest), tuple(s for s in sent if s != DATA_MANIFEST), bad, removed, links,
                      stale.notes)
