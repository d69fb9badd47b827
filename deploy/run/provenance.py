"""What produced a run, for `summary.json`'s `provenance`: pure, from what the edges read
(`deploy/edges/provenance.py`). Every value a host sent arrives here shape-checked.

    {"project": {"commit", "dirty", "diff_sha256", "changed_files", "changed_count"} | null,
     "meshrun": {"version", "build"},
     "hosts": {name: {"python", "torch", "cuda", "nccl", "meshrun", "gpus": [{"index", "name", "uuid"}]}
               | {"error": why}},
     "links": commplan.json's measurement and pairwise "matrix" | null, "trainer_config": {...} | null,
     "checkpoints": {"host", "files": {name: sha256}} | null}
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

from meshrun.deploy.check.answers import facts_of
from meshrun.deploy.check.verdicts import Gpu
from meshrun.deploy.run.answers import from_json, is_real
from meshrun.deploy.run.manifest import Manifest
from meshrun.layout import checkpoint_step

CHANGED_SHOWN = 100  # files named in `changed_files`; `changed_count` counts them all
DELETED = "deleted"
CONFIG_KIND = '"kind": "config"'  # what grep looks for in metrics.jsonl (train/metrics.config)
CONFIG_MAX_CHARS = 64 * 1024  # of one config record: the trainer's is a few hundred bytes
CONFIG_MAX_DEPTH = 6
LINK_FIELDS = ("hook", "nodes", "bandwidth_bytes_s", "rtt_s", "gradient_bytes")
MATRIX_FIELDS = ("source", "target", "mbit_s", "rtt_ms")
MATRIX_MAX = 4096  # pairs: 64 hosts


def porcelain_paths(status: bytes) -> list[str]:
    """The paths of `git status --porcelain=v1 -z --untracked-files=all --no-renames`."""
    return [entry[3:].decode("utf-8", "surrogateescape") for entry in status.split(b"\0") if len(entry) > 3]


def diff_sha256(changed: Mapping[str, str]) -> str | None:
    """One digest of the shipped files that differ from the commit: sha256 of `sha256sum`-style lines
    (`<file's sha256 or 'deleted'>  <path>`, sorted by path); None when nothing differs. Recompute it
    from a checkout with the same rule to tell whether a tree is the one that ran."""
    if not changed:
        return None
    lines = "".join(f"{digest}  {path}\n" for path, digest in sorted(changed.items()))
    return hashlib.sha256(lines.encode("utf-8", "surrogateescape")).hexdigest()


def project_state(commit: str | None, changed: Mapping[str, str]) -> dict[str, Any]:
    """The project's git state as shipped: `changed` maps each shipped path that differs from the
    commit (untracked ones included) to its content's sha256, or to 'deleted'."""
    names = sorted(changed)
    return {"commit": commit, "dirty": bool(changed), "diff_sha256": diff_sha256(changed),
            "changed_files": names[:CHANGED_SHOWN], "changed_count": len(names)}


def host_entry(host: str, facts_text: str, gpus: Iterable[Gpu]) -> dict[str, Any]:
    """One host's versions from the light facts probe's JSON (`deploy/host/facts.py light`), checked
    field by field like the check's; its GPUs from nvidia-smi (parsed by `host_queries.parse_gpus`)."""
    answer = from_json(facts_text.strip().splitlines()[-1] if facts_text.strip() else "")
    if not isinstance(answer, dict):
        return {"error": "the facts probe gave no JSON object"}
    fingerprint, _, _ = facts_of(host, answer)
    return {"python": fingerprint.python, "torch": fingerprint.torch, "cuda": fingerprint.cuda,
            "nccl": fingerprint.nccl, "meshrun": fingerprint.meshrun, "torch_error": fingerprint.error,
            "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid} for g in gpus]}


def checkpoint_files(manifest: Manifest) -> dict[str, str]:
    """name → sha256 of every checkpoint a manifest lists in the trainer's exact form."""
    return {} if manifest.too_big else {e.name: e.sha256 for e in manifest.entries}


def newest_checkpoints(manifests: Iterable[tuple[str, Manifest]]) -> dict[str, Any] | None:
    """{"host", "files"} of the first manifest that lists the newest step (hosts in the order given;
    one that lists no checkpoint is passed over), or None when none lists any."""
    best: tuple[int, str, dict[str, str]] | None = None
    for name, manifest in manifests:
        files = checkpoint_files(manifest)
        newest = max((s for s in map(checkpoint_step, files) if s is not None), default=-1)
        if files and (best is None or newest > best[0]):
            best = (newest, name, files)
    return None if best is None else {"host": best[1], "files": best[2]}


def _nested_within(value: object, limit: int) -> bool:
    """Whether `value` holds objects and lists at most `limit` levels deep. Iterative: a host's
    record can nest ~600 levels (json.loads allows it), where recursing would raise RecursionError."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def trainer_config(lines: str) -> dict[str, Any] | None:
    """The newest `config` record among metrics.jsonl lines (a resumed run adds one per start): its
    `config` object, when it is one, under 64 KiB and at most 6 levels deep; else None."""
    found = None
    for line in lines.splitlines():
        if len(line) > CONFIG_MAX_CHARS:
            continue
        record = from_json(line)
        if (isinstance(record, dict) and record.get("kind") == "config" and isinstance(record.get("config"), dict)
                and _nested_within(record["config"], CONFIG_MAX_DEPTH)):
            found = record["config"]
    return found


def link_facts(saved_plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What `--comm` measured (commplan.json): its summary numbers and the pairwise matrix
    (`links`: source, target, mbit_s, rtt_ms), each entry kept only in that shape."""
    if saved_plan is None:
        return None
    links = saved_plan.get("links") if isinstance(saved_plan.get("links"), list) else []
    matrix = [{k: link[k] for k in MATRIX_FIELDS} for link in links[:MATRIX_MAX] if _matrix_entry(link)]
    return {**{k: saved_plan.get(k) for k in LINK_FIELDS}, "matrix": matrix}


def _matrix_entry(link: object) -> bool:
    return (isinstance(link, dict) and all(isinstance(link.get(k), str) and 0 < len(link[k]) <= 64
                                           for k in ("source", "target"))
            and all(link.get(k) is None or is_real(link.get(k)) and link[k] >= 0 for k in ("mbit_s", "rtt_ms")))


def _text(value: object, limit: int = 80) -> str:
    shown = "-" if value is None else str(value) if isinstance(value, (str, int, float, bool)) else "?"
    return shown if len(shown) <= limit else shown[:limit] + "…"


def _get(record: object, key: str) -> Any:
    return record.get(key) if isinstance(record, dict) else None


def report_lines(prov: object) -> list[str]:
    """`fab report`'s account of summary.json's provenance (a detached run's provenance.json), one line
    per fact. The file could have been edited: every value is read with its type checked, and shown as text."""
    if not isinstance(prov, dict):
        return []
    project, build = _get(prov, "project"), _get(prov, "meshrun")
    lines = ["project: not a git work tree" if not isinstance(project, dict) else
             f"project: commit {_text(_get(project, 'commit'))}" + (
                 f", dirty: {_text(_get(project, 'changed_count'))} file(s) differ, diff sha256 "
                 f"{_text(_get(project, 'diff_sha256'))}" if _get(project, "dirty") is True else ", clean"),
             f"meshrun: {_text(_get(build, 'version'))} (build {_text(_get(build, 'build'))})"]
    hosts = _get(prov, "hosts")
    for name, host in sorted(hosts.items())[:64] if isinstance(hosts, dict) else []:
        if _get(host, "error") is not None:
            lines.append(f"host {_text(name)}: versions unknown ({_text(_get(host, 'error'), 160)})")
            continue
        gpus = _get(host, "gpus") if isinstance(_get(host, "gpus"), list) else []
        shown_gpus = ", ".join(f"{_text(_get(g, 'name'))} {_text(_get(g, 'uuid'))}" for g in gpus[:16]) or "none"
        lines.append(f"host {_text(name)}: python {_text(_get(host, 'python'))}, torch {_text(_get(host, 'torch'))}, "
                     f"CUDA {_text(_get(host, 'cuda'))}, NCCL {_text(_get(host, 'nccl'))}, "
                     f"meshrun {_text(_get(host, 'meshrun'))}; GPUs: {shown_gpus}")
    checkpoints = _get(_get(prov, "checkpoints"), "files")
    for name, digest in sorted(checkpoints.items())[:64] if isinstance(checkpoints, dict) else []:
        lines.append(f"checkpoint {_text(name)}: sha256 {_text(digest)}")
    if isinstance(_get(prov, "trainer_config"), dict):
        lines.append(f"trainer config: {len(prov['trainer_config'])} setting(s): fab report --json")
    return lines
