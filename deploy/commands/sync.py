"""`fab sync`: the project's code to every selected host, in parallel, one progress bar each, and
with `--data` the dataset at the same time.

Never under a running run: a run executes from its workdir, and an elastic worker restart, a
succession or a `--resume` imports whatever code is there then, so a sync meanwhile would run new
code beside the old in one job. Every host is asked first, with `fab setup`'s own host-side test
(`--check-only --agent-locks`: a run's agent holds its lock in the workdir for its whole life), and
one that runs a run refuses the whole sync before any host's files change.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
import time
from meshrun.deploy.edges.beside import Beside
from pathlib import Path

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.check_probes import open_sessions
from meshrun.deploy.edges.host_queries import parse_json_object
from meshrun.deploy.edges.codehints import hint_file, host_holds, load_hints, save_hints
from meshrun.deploy.edges.sessions import SessionsLater, close_all, sessions_to
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session
from meshrun.deploy.host import codestat
from meshrun.deploy.run.codehint import hint_key, may_hold
from meshrun.deploy.run.shell import local_workdir
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.edges.datasync import DataResult, DataSpec, build_manifest, parse_data_flag, sync_data
from meshrun.deploy.edges.datastale import same_names
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.edges.fanout import HostResults, on_each
from meshrun.deploy.edges.records import load_record
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.plan import python_of
from meshrun.deploy.run.syncbusy import busy_runs, under_runs
from meshrun.deploy.run.syncset import data_beside_code
from meshrun.deploy.render.console import HostProgress, Renderer
from meshrun.deploy.edges.sync import (Claim, RunsBusy, SyncResult, WorkdirTaken, busy_test_argv, check_owner,
                                       is_project_itself, project_claim, project_files, sync_host, taken_message)

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
              files: bytes | None = None, later: SessionsLater | None = None,
              timeout: float = SYNC_TIMEOUT_S) -> dict[str, SyncResult]:
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
        left = timeout - (time.monotonic() - started)  # the ask's time is the sync's
        return sync_host(host, root, inventory.known_hosts, files, bars.update, left, claim=claim,
                         python=python_of(host, sys.executable))

    with HostProgress(renderer, "sync", [h.name for h in hosts]) as bars:
        results = on_each(hosts, lambda h: one(h, bars), timeout=timeout + FANOUT_MARGIN_S)
    done = results.ok
    save_hints(hint_file(), {hint_key(where, h): local for h in hosts if h.name in done and not done[h.name].skipped})
    refuse_taken(results)
    refuse_busy(results, project.runs)
    return results.require_all()


class SyncUnderRun(MeshrunError):
    """A code sync that some host refused before its rsync: a run runs from its workdir."""


def refuse_busy(results: HostResults, runs: Path) -> None:
    """When a host's code sync was refused under a running run: one line naming the runs and their
    hosts (`under_runs`, a stop advised only for a run this controller's records put there), then any
    other host's error."""
    busy = {name: err.runs for name, err in results.failed.items() if isinstance(err, RunsBusy)}
    if not busy:
        return
    others = [str(err) for err in results.failed.values() if not isinstance(err, RunsBusy)]
    line = under_runs(busy, lambda run, host: recorded_on(runs, run, host), "the code sync",
                      f"nothing was synced to {'that host' if len(busy) == 1 else 'those hosts'}")
    raise SyncUnderRun("; ".join([line, *others]))


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


def sync_dataset(hosts: tuple[Host, ...], inventory: Inventory, root: Path, spec: DataSpec,
                 timeout: float = SYNC_TIMEOUT_S, held: Mapping[str, Session] | None = None) -> dict[str, DataResult]:
    """The dataset to every host in parallel, verified against its sha256 manifest; a workdir that
    holds another project's code gets none (its claim is one command over the host's session). `held`:
    sessions already open (`fab sync`'s, from its busy question), used instead of connecting again."""
    manifest = build_manifest(spec.source)
    claim = project_claim(root, inventory.path)
    held = held or {}

    def one(host: Host, session: Session) -> DataResult:
        python, began = python_of(host, sys.executable), time.monotonic()
        # Beside the owner's check, over the same session: it only reads (a round trip less per host).
        same = Beside(same_names, session, python, spec.dest, manifest, began + timeout)
        check_owner(host, session, root, claim)
        return sync_data(host, session, python, spec, manifest, root, inventory.known_hosts,
                         timeout - (time.monotonic() - began), same.result())

    with sessions_to(tuple(h for h in hosts if h.name not in held), inventory, root) as opened:
        sessions = {**held, **opened}
        results = on_each(hosts, lambda h: one(h, sessions[h.name]), timeout=timeout + FANOUT_MARGIN_S)
    refuse_taken(results)
    return results.require_all()


def recorded_on(runs: Path, run: str, host: str) -> bool:
    """Whether this controller's record of `run` (in `runs`) lists `host`; no readable record: False."""
    try:
        return host in load_record(runs, run).hosts
    except InputError:
        return False


def runs_from(host: Host, session: Session) -> tuple[str, ...]:
    """The runs whose agents run from `host`'s workdir, as `fab setup`'s `refuse_if_running` asks it,
    with the interpreter the runs' agents use. A host's answer is data: one that lies "none" only
    lets its own files change under its own run."""
    from meshrun.deploy.commands.setup import CHECK_TIMEOUT_S  # setup imports this module

    argv = busy_test_argv(python_of(host, sys.executable))
    result = session.run(argv, timeout=CHECK_TIMEOUT_S, create_workdir=True)
    data = parse_json_object(result.stdout) if result.stdout else None
    if data is None and result.rc in (126, 127):  # the shell's "cannot execute" and "not found"
        return ()  # no interpreter there that runs this inventory's runs: none of them runs there
    if data is not None and data.get("busy") is False:
        return ()
    error = data.get("error") if data is not None and data.get("busy") is True else None
    if isinstance(error, str) and (runs := busy_runs(error)):
        return runs
    if isinstance(error, str):  # busy in words of another version: the host's own, quoted
        raise MeshrunError(f"host '{host.name}': a run is running from its workdir ({said(error)}); nothing was "
                           "synced; stop it first (fab stop --run ID) or wait for it to end")
    why = said(result.stderr.strip()[-300:] or f"exit status {result.rc}")
    raise MeshrunError(f"host '{host.name}': could not tell whether a run is running from its workdir ({why}); "
                       "nothing was synced")


def refuse_under_runs(sessions: Mapping[str, Session], runs: Path | None = None) -> dict[str, MeshrunError]:
    """Every host asked at once, over its open session, before any is synced: a refusal after another
    host's sync would have changed that host's files. Returns why each host that could not be asked
    was not: it is synced by no one, the others are."""
    from meshrun.deploy.commands.setup import CHECK_TIMEOUT_S  # setup imports this module

    results = on_each(tuple(s.host for s in sessions.values()), lambda h: runs_from(h, sessions[h.name]),
                      timeout=CHECK_TIMEOUT_S + 5)
    busy = {name: found for name, found in results.ok.items() if found}
    if busy:
        raise MeshrunError(under_runs(busy, lambda run, host: runs is not None and recorded_on(runs, run, host)))
    return results.failed


def main(inventory_arg: str | None, hosts_arg: str | None, data: str | None, project: Project,
         timeout: float = SYNC_TIMEOUT_S) -> None:
    """`fab sync [--data SRC:DEST] [--timeout SECONDS]`: the code and the dataset, side by side when they
    cannot touch the same files (a no-op resync then costs the longer of the two, not their sum), each
    host's within `timeout` seconds. Each host is connected once: the busy question and the data sync
    share its session. One that cannot be connected or asked is synced by no one (its rsync would most
    likely fail the same way); the others are, and it is named at the end. A workdir that is the project
    itself gets nothing from a sync and is not asked."""
    root = project.root
    inv = load_inventory(inventory_path(inventory_arg, root), root)
    spec = parse_data_flag(data) if data else None
    selected = select_hosts(inv, hosts_arg).hosts
    renderer = Renderer()
    files = code_files(inv, project)
    sshtarget.check_all(selected)  # a bad ssh_config value is one line before any host is contacted
    sessions, unasked = open_sessions(tuple(h for h in selected if not is_project_itself(h, root)), inv, root,
                                      DEFAULT_CONNECT_TIMEOUT_S)
    try:
        unasked.update(refuse_under_runs(sessions, project.runs))
        held = {name: session for name, session in sessions.items() if name not in unasked}
        try:
            _sync_all(tuple(h for h in selected if h.name not in unasked), inv, project, spec, files, renderer,
                      timeout, held)
        except InputError:  # the user's to fix whatever the hosts do (a bad SRC, another project's workdir)
            raise
        except MeshrunError as err:
            raise MeshrunError("; ".join([*map(str, unasked.values()), str(err)])) from None
    finally:
        close_all(sessions)
    if unasked:
        raise MeshrunError("; ".join(str(err) for err in unasked.values()))


def _sync_all(selected: tuple[Host, ...], inv: Inventory, project: Project, spec: DataSpec | None, files: bytes,
              renderer: Renderer, timeout: float, held: Mapping[str, Session]) -> None:
    """The code, and the dataset beside it when they cannot touch the same files; one line each."""
    root = project.root
    beside = spec is not None and data_beside_code(spec.dest, files)
    # A daemon thread, not a pool: Ctrl-C must not wait for the data's rsyncs, which localproc stops.
    dataset = Beside(sync_dataset, selected, inv, root, spec, timeout, held) if beside else None
    try:
        code = sync_code(selected, inv, project, renderer, files, timeout=timeout)
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
    items = dataset.result() if dataset is not None else sync_dataset(selected, inv, root, spec, timeout, held)
    for link in (next(iter(items.values())).links if items else ()):  # SRC's, the same for every host: once
        renderer.info(f"data {spec.dest}: {link}")
    for item in items.values():
        for note in item.notes:
            renderer.warn(f"{item.host}: {note}")
        sent = f"{len(item.transferred)} sent" if item.transferred else "unchanged, nothing sent"
        removed = f"; {item.removed} removed (gone from SRC)" if item.removed else ""
        renderer.info(f"{item.host}: data {spec.dest}: {item.files} files verified by sha256; {sent}{removed}")
        if item.repaired:
            renderer.warn(f"{item.host}: corrupt copies found and sent again: {', '.join(item.repaired)}")
