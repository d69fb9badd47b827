"""summary.json's provenance rules (deploy/run/provenance.py), by exact equality; the real run is in
tests/test_fab_local.py (a dirty project tree)."""

from __future__ import annotations

import hashlib
import json

import pytest

from meshrun.deploy.check.verdicts import Gpu
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run import provenance as rules
from meshrun.deploy.run.manifest import Manifest, parse_manifest

A, B = "a" * 64, "b" * 64


def test_porcelain_paths_and_the_diff_digest() -> None:
    status = b" M README.md\0?? new file.txt\0D  gone.py\0"
    assert rules.porcelain_paths(status) == ["README.md", "new file.txt", "gone.py"]
    changed = {"b.py": B, "a.py": A, "gone.py": "deleted"}
    lines = f"{A}  a.py\n{B}  b.py\ndeleted  gone.py\n"
    assert rules.diff_sha256(changed) == hashlib.sha256(lines.encode()).hexdigest()
    assert rules.diff_sha256({}) is None
    assert rules.project_state("c0ffee", {}) == {"commit": "c0ffee", "dirty": False, "diff_sha256": None,
                                                 "changed_files": [], "changed_count": 0}
    many = {f"f{i:03d}": A for i in range(150)}
    state = rules.project_state(None, many)
    assert state["changed_count"] == 150 and len(state["changed_files"]) == 100 and state["dirty"] is True


def test_host_entry_is_shape_checked() -> None:
    facts = json.dumps({"python": "3.11.7", "torch": "2.14.1", "cuda": "12.4", "nccl": "2.21.5", "error": None,
                        "meshrun": {"version": "0.1.0", "build": "abcdef012345"}, "tools": {}})
    gpus = (Gpu(0, "NVIDIA H200", 1, 2, "GPU-1234"),)
    assert rules.host_entry("h1", "warning: noise\n" + facts, gpus) == {
        "python": "3.11.7", "torch": "2.14.1", "cuda": "12.4", "nccl": "2.21.5", "torch_error": None,
        "meshrun": "0.1.0 (build abcdef012345)", "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1234"}]}
    assert rules.host_entry("h1", "[1, 2]", ()) == {"error": "the facts probe gave no JSON object"}
    with pytest.raises(MeshrunError, match=r"host 'h1': the facts probe gave an unexpected answer: torch is \["):
        rules.host_entry("h1", json.dumps({"python": "3", "torch": [1]}), ())


def test_trainer_config_takes_the_newest_sound_record() -> None:
    deep: dict = {}
    node = deep
    for _ in range(10):
        node["x"] = {}
        node = node["x"]
    lines = "\n".join([json.dumps({"kind": "config", "config": {"epochs": 1}}),
                       json.dumps({"kind": "config", "config": {"epochs": 2}}),
                       json.dumps({"kind": "config", "config": deep}),  # too deep: skipped
                       json.dumps({"kind": "config", "config": "text"}),
                       '{"kind": "config", "config": {"epochs": 3}',  # cut short
                       json.dumps({"kind": "config", "config": {"pad": "x" * 70000}})])
    assert rules.trainer_config(lines) == {"epochs": 2}
    assert rules.trainer_config("") is None


def test_checkpoints_and_links() -> None:
    manifest = parse_manifest(f"{A}  ckpt-step000000010.pt\n{B}  best.pt\n{A}  ../../etc/passwd\n".encode())
    assert rules.checkpoint_files(manifest) == {"ckpt-step000000010.pt": A, "best.pt": B}
    saved = {"hook": "none", "nodes": 3, "bandwidth_bytes_s": 1e8, "rtt_s": 0.001, "gradient_bytes": 400,
             "floors": [], "reason": "x",
             "links": [{"source": "h1", "target": "h2", "mbit_s": 940.5, "rtt_ms": 0.3, "extra": 1},
                       {"source": "h1", "target": "h3", "mbit_s": None, "rtt_ms": None},
                       {"source": "h2", "target": 3, "mbit_s": 1, "rtt_ms": 1}, "junk",
                       {"source": "h2", "target": "h3", "mbit_s": -1, "rtt_ms": 1}]}
    assert rules.link_facts(saved) == {"hook": "none", "nodes": 3, "bandwidth_bytes_s": 1e8, "rtt_s": 0.001,
                                       "gradient_bytes": 400, "matrix": [
                                           {"source": "h1", "target": "h2", "mbit_s": 940.5, "rtt_ms": 0.3},
                                           {"source": "h1", "target": "h3", "mbit_s": None, "rtt_ms": None}]}
    assert rules.link_facts({"hook": "none"})["matrix"] == []
    assert rules.link_facts(None) is None


def test_report_lines_read_an_edited_summary_as_data() -> None:
    prov = {"project": {"commit": "c0", "dirty": True, "changed_count": 2, "diff_sha256": A},
            "meshrun": {"version": "0.1.0", "build": "abc"},
            "hosts": {"h1": {"python": "3.11", "torch": "2.14", "cuda": None, "nccl": None, "meshrun": "0.1.0 (build abc)",
                             "gpus": [{"name": "H200", "uuid": "GPU-1"}]},
                      "h2": {"error": "timed out"}, "h3": "garbage"},
            "checkpoints": {"host": "h1", "files": {"best.pt": B}}, "trainer_config": {"epochs": 1}}
    assert rules.report_lines(prov) == [
        f"project: commit c0, dirty: 2 file(s) differ, diff sha256 {A}",
        "meshrun: 0.1.0 (build abc)",
        "host h1: python 3.11, torch 2.14, CUDA -, NCCL -, meshrun 0.1.0 (build abc); GPUs: H200 GPU-1",
        "host h2: versions unknown (timed out)",
        "host h3: python -, torch -, CUDA -, NCCL -, meshrun -; GPUs: none",
        f"checkpoint best.pt: sha256 {B}",
        "trainer config: 1 setting(s): fab report --json"]
    assert rules.report_lines({"project": None, "meshrun": [1], "hosts": [1]}) == [
        "project: not a git work tree", "meshrun: - (build -)"]
    assert rules.report_lines("text") == []
    assert rules.report_lines({"project": {"commit": {"x": 1}, "dirty": False}, "meshrun": {}})[0] == \
        "project: commit ?, clean"


def test_the_newest_manifest_wins_and_the_first_of_equals() -> None:
    """One rule for the attached run's end (hosts asked over SSH) and a detached run's fetched files."""
    def manifest(*steps: int) -> Manifest:
        return parse_manifest("".join(f"{s:064x}  ckpt-step{s:09d}.pt\n" for s in steps).encode())

    a, b, c = manifest(10), manifest(10, 20), manifest(20)
    assert rules.newest_checkpoints([("h1", a), ("h2", b), ("h3", c)]) == {
        "host": "h2", "files": {f"ckpt-step{s:09d}.pt": f"{s:064x}" for s in (10, 20)}}
    assert rules.newest_checkpoints([("h3", c), ("h2", b)])["host"] == "h3"  # type: ignore[index]
    assert rules.newest_checkpoints([("h1", manifest()), ("h2", parse_manifest(b"junk\n"))]) is None
    assert rules.newest_checkpoints([]) is None


def test_trainer_config_nesting_is_bounded_without_recursing() -> None:
    """At most 6 levels of objects and lists; 600 (which json.loads allows) is left out, not a RecursionError."""
    def nested(levels: int) -> dict:
        value: object = 1
        for i in range(levels - 1):
            value = [value] if i % 2 else {"x": value}
        return {"x": value}

    def line(config: dict) -> str:
        return json.dumps({"kind": "config", "config": config})

    assert rules.trainer_config(line(nested(6))) == nested(6)
    assert rules.trainer_config(line(nested(7))) is None
    assert rules.trainer_config(line(nested(600))) is None
    assert rules.trainer_config(line({"a": [], "b": {}})) == {"a": [], "b": {}}
