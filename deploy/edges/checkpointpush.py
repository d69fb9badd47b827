"""`fab train --resume`'s push: the fetched checkpoints of a run to its rendezvous host, when no
host of the resumed run holds one as new, and what each host's own manifest lists."""

from __future__ import annotations

import sys
from typing import Mapping

from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS, run_dir
from meshrun.deploy.edges.check_probes import WRITE_FILE
from meshrun.deploy.edges.fetch import FETCH_TIMEOUT_S
from meshrun.deploy.edges.rsyncrun import run_rsync
from meshrun.deploy.edges.sessions import reachable_results
from meshrun.deploy.edges.sync import is_project_itself, push_dir_argv
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inputfiles import read_input
from meshrun.deploy.inventory.model import Inventory
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.manifest import MANIFEST_MAX_BYTES, Manifest, parse_manifest
from meshrun.deploy.run.plan import python_of
from meshrun.deploy.run.resume import newest_listed_step, pushed_manifest


def hosts_manifests(sessions: Mapping[str, Session], names: list[str], run_id: str) -> dict[str, Manifest]:
    """Each reachable host's own checkpoints manifest (a host without one is left out)."""
    path = f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}"
    argv = ["head", "-c", str(MANIFEST_MAX_BYTES + 1), path]
    return {name: parse_manifest(r.stdout.encode("utf-8", "surrogateescape"))
            for name, r in reachable_results(sessions, names, argv, 10) if r.ok}


def hosts_newest_step(sessions: Mapping[str, Session], names: list[str], run_id: str) -> int:
    """The newest step any reachable host lists in its own checkpoints manifest."""
    return max(map(newest_listed_step, hosts_manifests(sessions, names, run_id).values()), default=-1)


def push_checkpoints(selection: Selection, sessions: Mapping[str, Session], run_id: str, inventory: Inventory,
                     project: Project, renderer: Renderer) -> None:
    """Give the rendezvous host the fetched checkpoints of a resumed run, when no host holds one as
    new (every host keeps its own copies; the trainer broadcasts the newest from whoever has it).
    The files go first, never replacing the host's; then the manifest, atomically: the controller's
    verified lines for the files pushed, the host's own for those it kept (deploy/run/resume.py)."""
    local = project.run_home(run_id) / CHECKPOINTS
    head = selection.head
    manifest = local / CHECKPOINT_MANIFEST
    if not manifest.is_file() or is_project_itself(head, project.root):
        return
    text = read_input(manifest, MANIFEST_MAX_BYTES, "checkpoint manifest", "fetch the run again: fab fetch-checkpoints")
    held = hosts_manifests(sessions, [h.name for h in selection.hosts], run_id)
    ours, theirs = newest_listed_step(text), max(map(newest_listed_step, held.values()), default=-1)
    if ours <= theirs:
        renderer.info(f"resume: the hosts already hold step {theirs} (fetched: {ours}); nothing pushed")
        return
    argv = push_dir_argv(head, local, f"{run_dir(run_id)}/{CHECKPOINTS}", project.root, inventory.known_hosts)
    pushed: set[str] = set()
    run_rsync([argv[0], "--out-format=%n", *argv[1:]], host=head.name, what=f"pushing the checkpoints of {run_id}",
              timeout=FETCH_TIMEOUT_S, hint=f"check `fab check-network --hosts {head.name}`",
              on_line=lambda line: pushed.add(line.decode("utf-8", "replace")))  # the files the host lacked
    lines = pushed_manifest(parse_manifest(text), held.get(head.name, parse_manifest(b"")), pushed)
    written = sessions[head.name].run([python_of(head, sys.executable), "-c", WRITE_FILE,
                                       f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}", lines], timeout=30)
    if not written.ok:
        raise MeshrunError(f"host '{head.name}': could not push checkpoints of {run_id}: "
                           f"{said(written.stderr.strip()[-300:])}")
    renderer.info(f"resume: pushed checkpoints up to step {newest_listed_step(lines.encode())} to {head.name}")
