"""The controller's memory of the code it last synced to each host, and the host's own answer.

What the hint decides is pure (deploy/run/codehint.py). The hints are one small JSON file in
the user's cache folder, written atomically; a missing or unreadable file means "sync them all".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from meshrun.fsutil import atomic_write_bytes, read_regular
from meshrun.layout import WORKDIR_OWNER
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges.check_probes import PROBE_DIR
from meshrun.deploy.edges.preflightcache import cache_file
from meshrun.deploy.edges.stdinfeed import run_fed
from meshrun.deploy.edges.sync import Claim
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.host import codestat
from meshrun.deploy.inputfiles import RECORD_MAX
from meshrun.deploy.run.codehint import parse_hints, with_synced

CODE_CHECK_TIMEOUT_S = 20.0  # a stat of the listed files; past it the host is synced as before
CONTENT_CHECK_TIMEOUT_S = 120.0  # a read of every listed file (a join's question): a large untracked file counts


def hint_file() -> Path:
    """Beside the pre-flight's record, in the same cache folder."""
    return cache_file().with_name("codesync.json")


def load_hints(path: Path) -> dict[str, str]:
    try:
        return parse_hints(read_regular(path, RECORD_MAX))  # a FIFO or /dev/zero here is no hint
    except OSError:
        return {}


def save_hints(path: Path, synced: Mapping[str, str]) -> None:
    """Add what was just synced; never fatal (the next run just syncs again)."""
    if not synced:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Unsorted: the order is the age, and the oldest go first past HINTS_MAX.
        atomic_write_bytes(path, json.dumps(with_synced(load_hints(path), synced)).encode())
    except OSError:
        pass


def host_holds(session: Session, python: str, files: bytes, digest: str, claim: Claim | None = None) -> bool:
    """Whether the host's workdir holds the listed files as the project has them (codestat.py);
    no answer, a wrong one or an error all mean no. With `claim`, also whether the workdir's owner
    mark is this project's (no round trip more: the same command reads it); when not, the sync
    that follows claims it, or says whose it is."""
    owner = [claim.project_id, WORKDIR_OWNER] if claim is not None else []
    argv = [python, "-I", "-S", "-c", (PROBE_DIR / "codestat.py").read_text(), *owner]
    try:
        result = run_fed(session, argv, files, CODE_CHECK_TIMEOUT_S)
    except (MeshrunError, OSError):
        return False
    return result.ok and result.stdout.strip() == digest


def host_holds_content(session: Session, python: str, files: bytes, digest: str) -> bool:
    """Whether the host's workdir holds the listed files with the bytes `digest` (codestat.content_digest)
    says: `fab join`'s question to a member, true for a second clone or a file saved unchanged, which the
    quick check (times) calls different. No answer, a wrong one or an error all mean no."""
    argv = [python, "-I", "-S", "-c", (PROBE_DIR / "codestat.py").read_text(), codestat.CONTENT]
    try:
        result = run_fed(session, argv, files, CONTENT_CHECK_TIMEOUT_S)
    except (MeshrunError, OSError):
        return False
    return result.ok and result.stdout.strip() == digest
