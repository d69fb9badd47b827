"""`fab train --resume`'s push: the newest fetched checkpoint of a run (and best.pt) to its
rendezvous host, when no host of the resumed run holds one as new, and what each host's own
manifest lists. It pushes from the runs folder in use (`--runs-dir`), so a fetch into another
(`--dest`) copies the run's records there too (`copy_records`): without its launch.json no task
finds the run there, and a resume from the default folder would push nothing of what came."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from meshrun.fsutil import atomic_write_bytes
from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS, LAUNCH_RECORD, run_dir
from meshrun.deploy.edges.check_probes import WRITE_FILE
from meshrun.deploy.edges.fetch import FETCH_TIMEOUT_S
from meshrun.deploy.edges.records import RECORD_FIX, RunRecord, load_record, retire_attempt
from meshrun.deploy.edges.rsyncrun import run_rsync
from meshrun.deploy.edges.sessions import reachable_results
from meshrun.deploy.edges.sync import is_project_itself, push_named_argv
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import RECORD_MAX, read_input, read_optional
from meshrun.deploy.inventory.model import Inventory
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import network_hint, said
from meshrun.deploy.run.manifest import MANIFEST_MAX_BYTES, Manifest, parse_manifest
from meshrun.deploy.run.plan import python_of
from meshrun.deploy.run.recordcopy import RECORDS, RecordsHeld, records_to_copy
from meshrun.deploy.run.resume import newest_listed_step, pushed_manifest, same_as_ours, to_hash, to_push

# `python -c` on the host: `<sha256>  <name>` for each named regular file of the folder (argv[1]);
# a name that is missing, a link or unreadable prints nothing. Standard library only.
HASH_FILES = """import hashlib, os, stat, sys
os.chdir(sys.argv[1])
for name in sys.argv[2:]:
    try:  # O_NONBLOCK: a FIFO under that name must not block the open (it changes nothing for a file)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        continue
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            continue
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    print(digest.hexdigest() + "  " + name, flush=True)
"""


def hosts_manifests(sessions: Mapping[str, Session], names: list[str], run_id: str) -> dict[str, Manifest]:
    """Each reachable host's own checkpoints manifest (a host without one is left out)."""
    path = f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}"
    argv = ["head", "-c", str(MANIFEST_MAX_BYTES + 1), path]
    return {name: parse_manifest(r.stdout.encode("utf-8", "surrogateescape"))
            for name, r in reachable_results(sessions, names, argv, 10) if r.ok}


def hosts_newest_step(sessions: Mapping[str, Session], names: list[str], run_id: str) -> int:
    """The newest step any reachable host lists in its own checkpoints manifest."""
    return max(map(newest_listed_step, hosts_manifests(sessions, names, run_id).values()), default=-1)


HASH_FLOOR_S = 60  # the host's python starting, and small files
HASH_BYTES_PER_S = 20e6  # a slow disk: the deadline grows with the bytes to hash, not a fixed hour


def host_hashes(session: Session, run_id: str, names: tuple[str, ...], local: Path) -> Manifest:
    """The host's sha256 of the named checkpoints (names from the controller's own manifest, whose
    copies in `local` give the bytes to hash, and so the deadline: a host that stalls holds the
    resume no longer than hashing them on a slow disk would), read as a manifest: a line in any
    other form is no answer."""
    if not names:
        return parse_manifest(b"")
    host = session.host
    size = sum(os.lstat(local / name).st_size for name in names if os.path.lexists(local / name))
    found = session.run([python_of(host, sys.executable), "-c", HASH_FILES, f"{run_dir(run_id)}/{CHECKPOINTS}",
                         *names], timeout=HASH_FLOOR_S + size / HASH_BYTES_PER_S)
    if not found.ok:
        raise MeshrunError(f"host '{host.name}': could not hash the checkpoints pushed for {run_id}: "
                           f"{said(found.stderr.strip()[-300:])}; check the host, then resume again")
    return parse_manifest(found.stdout.encode("utf-8", "surrogateescape"))


def push_checkpoints(selection: Selection, sessions: Mapping[str, Session], run_id: str, inventory: Inventory,
                     project: Project, renderer: Renderer) -> None:
    """Give the rendezvous host the newest fetched checkpoint of a resumed run and best.pt
    (`to_push`: not every step the home folder gathered), when no host holds one as new (every
    host keeps its own copies; the trainer broadcasts the newest from whoever has it). The files
    go first, never replacing the host's, the manifest never with them; then the host hashes what
    the push names and its manifest does not list, and its manifest is written atomically: the
    controller's verified lines for the pushed files it holds with our bytes (pushed now or by a
    push cut short), the host's own for those it kept (deploy/run/resume.py)."""
    local = project.run_home(run_id) / CHECKPOINTS
    head = selection.head
    manifest = local / CHECKPOINT_MANIFEST
    if not manifest.is_file() or is_project_itself(head, project.root):
        return
    text = read_input(manifest, MANIFEST_MAX_BYTES, "checkpoint manifest", "fetch the run again: fab fetch-checkpoints")
    held = hosts_manifests(sessions, [h.name for h in selection.hosts], run_id)
    fetched, holding = newest_listed_step(text), max(map(newest_listed_step, held.values()), default=-1)
    if fetched <= holding:
        renderer.info(f"resume: the hosts already hold step {holding} (fetched: {fetched}); nothing pushed")
        return
    # Only the pushed files' lines count from here on: a step left home must not be hashed or listed.
    ours, theirs = to_push(parse_manifest(text)), held.get(head.name, parse_manifest(b""))
    # The manifest stays home (push_named_argv sends the names given, nothing else): a push cut
    # after it would leave the host listing files it never got, so the next resume would push nothing.
    argv = push_named_argv(head, local, tuple(e.name for e in ours.entries), f"{run_dir(run_id)}/{CHECKPOINTS}",
                           project.root, inventory.known_hosts)
    run_rsync(argv, host=head.name, what=f"pushing the checkpoints of {run_id}", timeout=FETCH_TIMEOUT_S,
              hint=network_hint(head.name))
    asked = to_hash(ours, theirs)
    same = same_as_ours(ours, host_hashes(sessions[head.name], run_id, asked, local), asked)
    lines = pushed_manifest(ours, theirs, same)
    written = sessions[head.name].run([python_of(head, sys.executable), "-c", WRITE_FILE,
                                       f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}", lines], timeout=30)
    if not written.ok:
        raise MeshrunError(f"host '{head.name}': could not push checkpoints of {run_id}: "
                           f"{said(written.stderr.strip()[-300:])}")
    renderer.info(f"resume: pushed checkpoints up to step {newest_listed_step(lines.encode())} to {head.name}")


def _held(folder: Path, started: float | None) -> RecordsHeld:
    found = {name: _written(folder / name) for name in RECORDS}
    return RecordsHeld(started, {name: at for name, at in found.items() if at is not None})


def _written(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return None


def copy_records(record: RunRecord, runs: Path, dest: Path, renderer: Renderer) -> tuple[str, ...]:
    """`--dest DIR`: the run's records (`RECORDS`, those there) from `runs` into DIR/<id>/ as
    `records_to_copy` says, each atomically and byte for byte: `--runs-dir DIR` then finds the run
    (`fab report`; `fab train --resume`, which pushes back the checkpoints fetched there). A record
    there meshrun cannot read is not judged older: kept, in one warning. Returns the names copied."""
    source, target = runs / record.run_id, dest / record.run_id
    try:
        there = load_record(dest, record.run_id).started if os.path.lexists(target / LAUNCH_RECORD) else None
    except InputError as err:
        renderer.warn(f"{err}; the run's records were not copied there, so --runs-dir {dest} does not find it")
        return ()
    retire, names = records_to_copy(_held(source, record.started), _held(target, there))
    if there is not None and there > record.started:
        renderer.info(with_path("", target, f" holds a later attempt of run {record.run_id} (resumed from there): "
                                "its records kept"))
    copied: list[str] = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        if retire:
            retire_attempt(target)
        for name in names:
            data = read_optional(source / name, RECORD_MAX, "run record", RECORD_FIX)
            if data is not None:  # retired by a resume since it was listed: the next fetch copies its successor
                atomic_write_bytes(target / name, data)
                copied.append(name)
    except (OSError, InputError) as err:
        renderer.warn(with_path("run records not copied into ", target, f" ({getattr(err, 'strerror', None) or err})"))
    if copied:
        renderer.info(with_path(f"{', '.join(copied)} copied into ", target,
                                f": with --runs-dir {dest}, report and train --resume find the run there"))
    return tuple(copied)
