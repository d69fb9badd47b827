"""Reading what produced a run (the rules and the record's shape: `deploy/run/provenance.py`): the
project's git state on this controller, each host's versions and GPUs (the light facts probe, which
does not import torch, and nvidia-smi), the trainer's config record and the final checkpoints'
sha256 (the hosts' own manifests). What a host sends is shape-checked there; a host that does not
answer has an `error` entry, never a stalled or failed run."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any, Mapping

from meshrun.layout import CHECKPOINT_MANIFEST, CHECKPOINTS, HOSTS, METRICS, PROVENANCE, run_dir
from meshrun.deploy.check.verdicts import Gpu
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges import host_queries
from meshrun.deploy.edges.check_probes import FACTS_TIMEOUT_S, probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.sessions import first_found, reachable_results
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.edges.wheel import controller_identity
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run import provenance as rules
from meshrun.deploy.run.answers import from_json, said
from meshrun.fsutil import atomic_write_json, not_regular
from meshrun.deploy.inputfiles import RECORD_MAX, read_optional
from meshrun.deploy.run.manifest import MANIFEST_MAX_BYTES, parse_manifest
from meshrun.deploy.run.plan import python_of

GIT_TIMEOUT_S = 30
GPU_QUERY_TIMEOUT_S = 30
FETCHED_METRICS_READ = 4 << 20  # the config record is among a run's first lines; each resume adds one


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S)


def _digest(path: Path) -> str:
    if not path.is_file() or path.is_symlink():
        return rules.DELETED if not path.exists() and not path.is_symlink() else "link-or-special"
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def project_state(root: Path, shipped: bytes) -> dict[str, Any] | None:
    """The commit, and the shipped files (`shipped`: fab sync's NUL-separated list) that differ from
    it; None when the project is not a git work tree (or git is missing)."""
    try:
        if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
            return None
        head = _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
        status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.decode().strip() if head.returncode == 0 else None
    names = {n.decode("utf-8", "surrogateescape") for n in shipped.split(b"\0") if n}
    changed = {}
    for path in rules.porcelain_paths(status.stdout):
        digest = _digest(root / path)
        if path in names or digest == rules.DELETED:
            changed[path] = digest
    return rules.project_state(commit, changed)


def host_versions(hosts: tuple[Host, ...], sessions: Mapping[str, Session], local_python: str) -> dict[str, Any]:
    """Each host's python/torch/CUDA/NCCL/meshrun and its GPUs, in parallel; a host whose probe fails
    or answers out of shape gets {"error": why}."""
    def one(host: Host) -> dict[str, Any]:
        session = sessions[host.name]
        result = session.run(probe_argv(python_of(host, local_python), "facts", "light"), timeout=FACTS_TIMEOUT_S)
        if not result.ok:
            return {"error": said((result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1])}
        facts = host_queries.parse_json_object(result.stdout) or {}
        tools = facts.get("tools") if isinstance(facts.get("tools"), dict) else {}
        return rules.host_entry(host.name, result.stdout, _gpus(session, tools.get("nvidia-smi")))

    found = on_each(hosts, one, timeout=FACTS_TIMEOUT_S + GPU_QUERY_TIMEOUT_S + 5)
    return {h.name: found.ok[h.name] if h.name in found.ok else {"error": said(str(found.failed.get(h.name)))}
            for h in hosts}


def _gpus(session: Session, nvidia_smi: object) -> tuple[Gpu, ...]:
    """The GPUs the host's nvidia-smi lists; none when the path it names is no absolute, printable path
    (a lone surrogate or a newline could not be sent as the command: deploy/check/answers.host_path)."""
    if not (isinstance(nvidia_smi, str) and nvidia_smi.startswith("/") and nvidia_smi.isprintable()):
        return ()
    result = session.run([nvidia_smi, *host_queries.NVIDIA_SMI_QUERY], timeout=GPU_QUERY_TIMEOUT_S)
    return tuple(Gpu(*g) for g in host_queries.parse_gpus(result.stdout)) if result.ok else ()


def final_checkpoints(sessions: Mapping[str, Session], names: list[str], run_id: str) -> dict[str, Any] | None:
    """The checkpoints (name → sha256) of the reachable host whose manifest lists the newest step."""
    argv = ["head", "-c", str(MANIFEST_MAX_BYTES + 1), f"{run_dir(run_id)}/{CHECKPOINTS}/{CHECKPOINT_MANIFEST}"]
    return rules.newest_checkpoints(
        (name, parse_manifest(result.stdout.encode("utf-8", "surrogateescape") if result.ok else b""))
        for name, result in reachable_results(sessions, names, argv, 10))


def trainer_config(sessions: Mapping[str, Session], names: list[str], run_id: str) -> dict[str, Any] | None:
    """The trainer's config record from metrics.jsonl on the first host that has one (rank 0's)."""
    argv = ["grep", "-F", "-m", "64", "--", rules.CONFIG_KIND, f"{run_dir(run_id)}/metrics.jsonl"]
    return first_found(sessions, names, argv, 10, lambda result: rules.trainer_config(result.stdout))


def at_launch(hosts: tuple[Host, ...], sessions: Mapping[str, Session], root: Path, shipped: bytes,
              local_python: str) -> dict[str, Any]:
    """What is known once the code is on the hosts: the tree that shipped, this build, the hosts'."""
    return {"project": project_state(root, shipped), "meshrun": dataclasses.asdict(controller_identity()),
            "hosts": host_versions(hosts, sessions, local_python)}


def at_end(sessions: Mapping[str, Session], names: list[str], run_id: str,
           saved_plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the run itself left: the measured links, the config the trainer ran, its final checkpoints."""
    return {"links": rules.link_facts(saved_plan), "trainer_config": safely(trainer_config, sessions, names, run_id),
            "checkpoints": safely(final_checkpoints, sessions, names, run_id)}


def save_at_launch(runs: Path, run_id: str, origin: Mapping[str, Any]) -> None:
    """A detached run's provenance as far as the launch knows it; no summary.json will hold it."""
    atomic_write_json(runs / run_id / PROVENANCE, dict(origin))


def detached(runs: Path, run_id: str, saved_plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A detached run's provenance: what its launch saved, and the end read from the files
    `fab fetch-checkpoints` brought home (each host's copy under hosts/<name>/, or the run dir itself
    for the local host), shape-checked as a host's answer is: they came from the hosts. None
    without the launch's record (an attached run, or one older than this)."""
    home = runs / run_id
    data = read_optional(home / PROVENANCE, RECORD_MAX, "run provenance", "the file is damaged or was edited; remove it")
    origin = from_json(data.decode("utf-8", "replace")) if data is not None else None
    if not isinstance(origin, dict):
        return None
    places = [(d.name, d) for d in sorted((home / HOSTS).glob("*")) if d.is_dir()] + [("", home)]
    return {**origin, "links": rules.link_facts(saved_plan), "trainer_config": _fetched_config(places),
            "checkpoints": _fetched_checkpoints(places)}


def _head(path: Path, limit: int) -> bytes:
    """At most `limit` bytes from the start of a regular file (not through a symlink); b"" otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return b""
    try:
        if not_regular(os.fstat(fd).st_mode) is not None:
            return b""
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _fetched_config(places: list[tuple[str, Path]]) -> dict[str, Any] | None:
    for _, place in places:
        lines = _head(place / METRICS, FETCHED_METRICS_READ).decode("utf-8", "replace").splitlines()
        if (config := rules.trainer_config("\n".join(ln for ln in lines if rules.CONFIG_KIND in ln))) is not None:
            return config
    return None


def _fetched_checkpoints(places: list[tuple[str, Path]]) -> dict[str, Any] | None:
    return rules.newest_checkpoints((name or "fetched", parse_manifest(_head(place / CHECKPOINTS / CHECKPOINT_MANIFEST,
                                                                             MANIFEST_MAX_BYTES + 1)))
                                    for name, place in places)


def safely(read: Any, *args: Any) -> Any:
    """A provenance reading that failed is left out (null), never the run's failure."""
    try:
        return read(*args)
    except MeshrunError:
        return None
