"""Bringing a run home: each host's run directory into `runs/<id>/hosts/<host>/`, and the newest
verified checkpoints into `runs/<id>/checkpoints/`.

Transfers go to a staging directory first (`.incoming/<host>/`, rsync `--partial-dir`), so an
interrupted fetch resumes where it stopped. Checkpoints are verified against the trainer's
`MANIFEST.sha256` before they are kept; a file that differs from one already here is never
overwritten unless `force`.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.layout import run_dir
from deploy.errors import MeshrunError
from deploy.inventory.model import Host

from deploy.run.shell import local_workdir
from deploy.edges.sync import PROGRESS_RE, remote_path, ssh_argv
from common.fsutil import sha256_file

MANIFEST = "MANIFEST.sha256"
CHECKPOINTS = "checkpoints"


@dataclass
class FetchReport:
    host: str
    landed: Path
    new: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # differ from a local file; kept the local one
    corrupt: list[str] = field(default_factory=list)  # checksum mismatch; not kept
    newest_step: int = -1


def read_manifest(path: Path) -> dict[str, str]:
    """{filename: sha256} from `sha256sum`-format lines; unreadable lines are ignored."""
    entries = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            entries[name.strip()] = digest
    return entries


def fetch_argv(host: Host, run_id: str, staging: Path, root: Path, known_hosts: Path | None) -> list[str]:
    """rsync the host's whole run directory into `staging`, resumable."""
    argv = ["rsync", "--archive", "--partial-dir=.rsync-partial", "--info=progress2", "--no-inc-recursive"]
    if host.is_local:
        source = f"{local_workdir(host.workdir, root) / run_dir(run_id)}/"
        return argv + [source, f"{staging}/"]
    source = f"{host.ssh_host}:{remote_path(host.workdir)}/{run_dir(run_id)}/"
    return argv + ["-e", shlex.join(ssh_argv(host, known_hosts)), source, f"{staging}/"]


def transfer(argv: list[str], host: str, progress: Callable[[str, int], None]) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
        for match in PROGRESS_RE.finditer(chunk):
            progress(host, int(match.group(1)))
    err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    if proc.wait() != 0:
        raise MeshrunError(f"host '{host}': fetch failed (rsync exit {proc.returncode}): "
                           f"{err[-1] if err else 'no message'}; run the same fetch again to resume")
    progress(host, 100)


def verify_checkpoints(staging: Path, report: FetchReport) -> None:
    """Delete staged checkpoint files whose sha256 differs from the manifest; record them."""
    directory = staging / CHECKPOINTS
    manifest = read_manifest(directory / MANIFEST)
    for name, digest in manifest.items():
        path = directory / name
        if path.exists() and sha256_file(path) != digest:
            report.corrupt.append(f"{CHECKPOINTS}/{name}")
            path.unlink()
    steps = [int(n[len("ckpt-step"):-3]) for n in manifest if n.startswith("ckpt-step") and (directory / n).exists()]
    report.newest_step = max(steps, default=-1)


def place(staging: Path, target: Path, report: FetchReport, force: bool, prefix: str = "") -> None:
    """Move staged files into `target`: new ones land, identical ones are dropped, a differing
    local file is kept (a conflict) unless `force`."""
    for src in sorted(p for p in staging.rglob("*") if p.is_file() and ".rsync-partial" not in p.parts):
        rel = src.relative_to(staging)
        dst = target / rel
        name = prefix + str(rel)
        if not dst.exists():
            report.new.append(name)
        elif sha256_file(dst) == sha256_file(src):
            report.unchanged.append(name)
            continue
        elif not force:
            report.conflicts.append(name)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def remove_staging(staging: Path) -> None:
    """The staged copy goes once placed; partial transfers stay so the next fetch resumes."""
    for path in sorted(staging.rglob("*"), reverse=True):
        if ".rsync-partial" in path.parts:
            continue
        if path.is_file():
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    if staging.exists() and not any(staging.iterdir()):
        staging.rmdir()
