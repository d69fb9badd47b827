"""`fab sync`: the project's code to every selected host, in parallel, one progress bar each, and
with `--data` the dataset at the same time."""

from __future__ import annotations

import os
import sys
import time
from meshrun.deploy.edges.beside import Beside
from pathlib import Path

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.codehints import hint_file, host_holds, load_hints, save_hints
from meshrun.deploy.edges.sessions import SessionsLater, sessions_to
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.host import codestat
from meshrun.deploy.run.codehint import hint_key, may_hold
from meshrun.deploy.run.shell import local_workdir
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.edges.datasync import DataResult, DataSpec, build_manifest, parse_data_flag, sync_data
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.edges.fanout import HostResults, on_each
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.run.plan import python_of
from meshrun.deploy.run.syncset import data_beside_code
from meshrun.deploy.render.console import HostProgress, Renderer
from meshrun.deploy.edges.sync import (Claim, SyncResult, WorkdirTaken, check_owner, project_claim, project_files,
                                       sync_host, taken_message)

SYNC_TIMEOUT_S = 900
SESSION_WAIT_S = 60  # a hinted host's session, at most; then it is synced as any other
FANOUT_MARGIN_S = 30  # rsync is stopped at its own deadline: its message, not the fan-out's, says why


def code_files(inventory: Inventory, project: Project) -> bytes:
    """What the code sync sends: the project's files less the inventory in use, its key files and
    the runs folder in use (`--runs-dir` may name one inside the project: fetched host trees there
    hold what one host served, for no other host to read)."""
    if os.path.realpath(project.runs) == os.path.realpath(project.root):
        raise InputError(f"--runs-dir {project.runs}: is the project itself, whose files every host gets; "
                         "name a folder inside or outside it")
    private = tuple(p for p in (inventory.path, inventory.known_hosts, *(h.identity for h in inventory.hosts)) if p)
    # A local host's workdir in a folder of the project holds the last copy: shipped, it would nest
    # a copy in each copy (`wd/wd/wd`). `workdir: .` is the project itself and is not synced.
    copies = tuple(local_workdir(h.workdir, project.root) for h in inventory.hosts if h.is_local)
    return project_files(project.root, tuple(Path(p).expanduser() for p in private),
                         (project.runs, *(c for c in copies if c.resolve() != project.root.resolve())))


def sync_code(hosts: tuple[Host, ...], inventory: Inventory, project: Project, renderer: Renderer,
              files: bytes | None = None, later: SessionsLater | None = None) -> dict[str, SyncResult]:
    """Sync to every host; raises one MeshrunError naming each host that failed (an InputError when
    each failed for holding another project's code: edges/sync.py). With `later` (`fab train`), a
    host last synced this very code is asked first, over its session once open, and synced only if
    what it holds differs (deploy/run/codehint.py); the others at once."""
    root = project.root
    files = code_files(inventory, project) if files is None else files
    sshtarget.check_all(hosts)  # a bad ssh_config value is one line before any host is contacted
    names = [n for n in files.split(b"\0") if n]
    local, where = codestat.digest(os.fsencode(root), names), os.path.realpath(root)
    hints, started = (load_hints(hint_file()) if later is not None else {}), time.monotonic()
    claim = project_claim(root, inventory.path)

    def one(host: Host, bars: HostProgress) -> SyncResult:
        key = hint_key(where, host)
        if later is not None and may_hold(hints, key, local) and _holds(host, later, files, local, claim):
            bars.update(host.name, 100)
            return SyncResult(host.name, False, len(names), unchanged=True)
        left = SYNC_TIMEOUT_S - (time.monotonic() - started)  # the ask's time is the sync's
        return sync_host(host, root, inventory.known_hosts, files, bars.update, left, claim=claim)

    with HostProgress(renderer, "sync", [h.name for h in hosts]) as bars:
        results = on_each(hosts, lambda h: one(h, bars), timeout=SYNC_TIMEOUT_S + FANOUT_MARGIN_S)
    done = results.ok
    save_hints(hint_file(), {hint_key(where, h): local for h in hosts if h.name in done and not done[h.name].skipped})
    refuse_taken(results)
    return results.require_all()


def refuse_taken(results: HostResults) -> None:
    """When every host that failed holds another project's code: one InputError, one clause per
    workdir and project (32 hosts of one lab inventory are one clause, not 32)."""
    failed = list(results.failed.values())
    if not failed or not all(isinstance(e, WorkdirTaken) for e in failed):
        return
    groups: dict[tuple[str, str | None, Claim], list[str]] = {}
    for err in failed:
        groups.setdefault((err.workdir, err.other, err.claim), []).append(err.host)
    raise InputError("; ".join(taken_message(tuple(hosts), workdir, other, claim)
                               for (workdir, other, claim), hosts in groups.items()))


def _holds(host: Host, later: SessionsLater, files: bytes, digest: str, claim: Claim) -> bool:
    session = later.get(host.name, SESSION_WAIT_S)
    return session is not None and host_holds(session, python_of(host, sys.executable), files, digest, claim)


def sync_dataset(hosts: tuple[Host, ...], inventory: Inventory, root: Path, spec: DataSpec) -> dict[str, DataResult]:
    """The dataset to every host in parallel, verified against its sha256 manifest; a workdir that
    holds another project's code gets none (its claim is one command over the session opened here)."""
    manifest = build_manifest(spec.source)
    claim = project_claim(root, inventory.path)

    def one(host: Host, session: Session) -> DataResult:
        check_owner(host, session, root, claim)
        return sync_data(host, session, python_of(host, sys.executable), spec, manifest, root,
                         inventory.known_hosts, SYNC_TIMEOUT_S)

    with sessions_to(hosts, inventory, root) as sessions:
        results = on_each(hosts, lambda h: one(h, sessions[h.name]), timeout=SYNC_TIMEOUT_S + FANOUT_MARGIN_S)
    refuse_taken(results)
    return results.require_all()


def main(inventory_arg: str | None, hosts_arg: str | None, data: str | None, project: Project) -> None:
    """`fab sync [--data SRC:DEST]`: the code and the dataset, side by side when they cannot touch
    the same files (a no-op resync then costs the longer of the two, not their sum)."""
    root = project.root
    inv = load_inventory(inventory_path(inventory_arg, root), root)
    spec = parse_data_flag(data) if data else None
    selected = select_hosts(inv, hosts_arg).hosts
    renderer = Renderer()
    files = code_files(inv, project)
    beside = spec is not None and data_beside_code(spec.dest, files)
    # A daemon thread, not a pool: Ctrl-C must not wait for the data's rsyncs, which localproc stops.
    dataset = Beside(sync_dataset, selected, inv, root, spec) if beside else None
    try:
        code = sync_code(selected, inv, project, renderer, files)
    except MeshrunError:
        # A bad SRC (unreadable file, refused name) is the user's to fix whatever the hosts do,
        # and it would be lost behind an unreachable host's error.
        if dataset is not None:
            dataset.settle()
            if isinstance(dataset.error, InputError):
                raise dataset.error from None
        raise
    if dataset is not None:
        dataset.settle()  # the data sync must not outlive this command
    for result in code.values():
        renderer.info(f"{result.host}: " + ("workdir is this project, nothing to copy" if result.skipped
                                             else f"{result.files} files in sync"))
    if spec is None:
        return
    items = dataset.result() if dataset is not None else sync_dataset(selected, inv, root, spec)
    for item in items.values():
        sent = f"{len(item.transferred)} sent" if item.transferred else "unchanged, nothing sent"
        renderer.info(f"{item.host}: data {spec.dest}: {item.files} files verified by sha256; {sent}")
        if item.repaired:
            renderer.warn(f"{item.host}: corrupt copies found and sent again: {', '.join(item.repaired)}")
