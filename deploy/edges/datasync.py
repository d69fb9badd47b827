"""`fab sync --data SRC:DEST`: a dataset directory to every host, with a sha256 manifest.

rsync's quick check (size + mtime) skips unchanged files and its delta transfer sends only what
changed. The manifest (`MANIFEST.sha256`, sha256sum format, written next to the data) then lets
each host verify what it holds: a file whose bytes differ while size and mtime match (bit rot,
a half-written copy) is caught, sent again with rsync's checksum comparison, and verified once
more. Local hashes are cached by (size, mtime) so an unchanged dataset is not re-read.
"""

from __future__ import annotations

import json
import re
import shlex
from stat import S_ISDIR
import time
from dataclasses import dataclass
from pathlib import Path

from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import flag_path_stat
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.shell import local_workdir
from meshrun.deploy.edges.rsyncrun import io_timeout_option, run_rsync
from meshrun.deploy.edges.sync import PROTECT_ARGS, remote_path, remote_spec, ssh_argv
from meshrun.deploy.edges.transport import Session
from meshrun.fsutil import read_regular, sha256_file

MANIFEST = "MANIFEST.sha256"
CACHE = ".meshrun-hash-cache.json"
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


def build_manifest(source: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `source`, reusing cached hashes of unchanged files."""
    cache_path = source / CACHE
    try:  # meshrun's own file, but in the user's folder: any shape, or a FIFO, means no cache
        cache = json.loads(read_regular(cache_path, CACHE_MAX))
    except (OSError, ValueError, RecursionError):
        cache = {}
    if not isinstance(cache, dict) or not all(isinstance(v, dict) for v in cache.values()):
        cache = {}
    manifest, fresh = {}, {}
    for path in sorted(p for p in source.rglob("*") if p.is_file() and p.name not in (MANIFEST, CACHE)):
        rel = path.relative_to(source).as_posix()
        stat = path.stat()
        key = f"{stat.st_size}:{stat.st_mtime_ns}"
        cached = cache.get(rel, {}).get(key)
        digest = cached if isinstance(cached, str) and SHA256_RE.fullmatch(cached) else sha256_file(path)
        manifest[rel], fresh[rel] = digest, {key: digest}
    cache_path.write_text(json.dumps(fresh))
    (source / MANIFEST).write_text("".join(f"{d}  {r}\n" for r, d in manifest.items()))
    return manifest


def rsync_data_argv(host: Host, spec: DataSpec, root: Path, known_hosts: Path | None, checksum: bool,
                    files: list[str] | None = None) -> list[str]:
    argv = ["rsync", PROTECT_ARGS, io_timeout_option(), "--archive", "--mkpath", "--itemize-changes", "--exclude", CACHE]
    if checksum:
        argv.append("--checksum")
    if files is not None:
        argv += ["--files-from=-", "--from0"]
    if host.is_local:
        target = str(local_workdir(host.workdir, root) / spec.dest) if not spec.dest.startswith("/") else spec.dest
        return argv + [f"{spec.source}/", f"{target}/"]
    dest = spec.dest if spec.dest.startswith("/") else f"{remote_path(host.workdir)}/{spec.dest}"
    return argv + ["-e", shlex.join(ssh_argv(host, known_hosts)), f"{spec.source}/",
                   remote_spec(host.ssh_host, f"{dest}/")]


def changed_file(line: str) -> str | None:
    """The file rsync sent, from one --itemize-changes line (`<f+++++++++ name` to a remote host,
    `>f...` for a local copy); None for other lines."""
    return line.split(" ", 1)[1] if line.startswith(("<f", ">f")) and " " in line else None


def _rsync(argv: list[str], host: str, deadline: float, stdin: bytes | None = None) -> tuple[str, ...]:
    """Run one data rsync before `deadline`; the files it sent."""
    sent: list[str] = []

    def on_line(line: bytes) -> None:
        name = changed_file(line.decode(errors="replace"))
        if name is not None:
            sent.append(name)

    run_rsync(argv, host=host, what="data sync", timeout=_left(deadline), stdin=stdin, on_line=on_line,
              hint=f"check `fab check-network --hosts {host}`")
    return tuple(sent)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


# Runs on the host with its python: checks DEST against DEST/MANIFEST.sha256, prints failing names as JSON.
VERIFY = """
import hashlib, json, os, sys
os.chdir(sys.argv[1])
bad = []
for line in open("MANIFEST.sha256", encoding="utf-8"):
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
    result = session.run([python, "-c", VERIFY, dest], timeout=timeout)
    try:
        answer = result.last_json()
    except (ValueError, IndexError):
        answer = None
    if not isinstance(answer, list):
        raise MeshrunError(f"host '{session.host.name}': could not verify {dest}: {result.stderr.strip()[-200:]}")
    return listed_only(answer, manifest)


def listed_only(names: list[object], manifest: dict[str, str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for n in names if isinstance(n, str) and n in manifest))


def sync_data(host: Host, session: Session, python: str, spec: DataSpec, manifest: dict[str, str], root: Path,
              known_hosts: Path | None, timeout: float) -> DataResult:
    """Send what changed, verify everything against the manifest, resend and re-verify what fails;
    all of it within `timeout` s."""
    deadline = time.monotonic() + timeout
    sent = _rsync(rsync_data_argv(host, spec, root, known_hosts, checksum=False), host.name, deadline)
    bad = verify(session, python, spec.dest, manifest, _left(deadline))
    if bad:
        files = b"\0".join(b.encode() for b in bad) + b"\0"
        _rsync(rsync_data_argv(host, spec, root, known_hosts, checksum=True, files=list(bad)), host.name, deadline,
               files)
        still = verify(session, python, spec.dest, manifest, _left(deadline))
        if still:
            raise MeshrunError(f"host '{host.name}': data files still corrupt after a second transfer: "
                               f"{', '.join(still)}; check the host's disk")
    return DataResult(host.name, len(manifest), tuple(s for s in sent if s != MANIFEST), bad)
