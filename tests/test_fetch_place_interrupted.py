"""`fab fetch-checkpoints` cut off while it places files (Ctrl-C, a closed terminal: the fan-out's
worker threads die where they are). What a fetch placed used to be recorded (`.placed/<host>.json`,
and for `runs/<id>/checkpoints/` its manifest) only once all was placed: the files already moved
in were vouched for by nobody, so on a live run the next fetch kept them as "not overwritten"
(your files) and needed --force, and the assembled best.pt was not updated. Real files, moved by
real rsync from a local host; the cut is a KeyboardInterrupt raised as the third file is to be
renamed into place."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from meshrun.deploy.commands.fetch import main
from meshrun.deploy.edges.placed import journal_to, read_journal, read_placed
from meshrun.deploy.edges import fetchplace as fetch_edge
from meshrun.deploy.project import Project
from tests.localrun import local_h2_project
from meshrun.deploy.run.manifest import manifest_text, parse_manifest

RUN = "20260101-000000-abcd"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _project(tmp_path: Path) -> Project:
    return local_h2_project(tmp_path, RUN)


def _trained_to(tmp_path: Path, step: int) -> dict[str, str]:
    """The host's run folder as its live trainer leaves it at `step`: the last two saves, best.pt
    (rewritten under one name), their manifest, and a progress file rewritten in place."""
    run = tmp_path / "w2/runs" / RUN
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for old in checkpoints.glob("*.pt"):
        old.unlink()
    files = {f"ckpt-step{s:09d}.pt": f"weights at {s}".encode() for s in (step - 100, step)}
    files["best.pt"] = f"best at {step - 50}".encode()
    for name, data in files.items():
        (checkpoints / name).write_bytes(data)
    digests = {name: sha(data) for name, data in files.items()}
    (checkpoints / "MANIFEST.sha256").write_text(manifest_text(digests))
    (run / "progress.json").write_text(json.dumps({"step": step}))
    return digests


def _cut_at_commit(monkeypatch: pytest.MonkeyPatch, into: Path, number: int) -> None:
    """The `number`-th rename into `into` (a folder or under it) never happens: the process is cut."""
    real, seen = fetch_edge._commit, []

    def commit(src: Path, dst: Path) -> None:
        if dst.is_relative_to(into):
            seen.append(dst)
            if len(seen) == number:
                raise KeyboardInterrupt
        real(src, dst)
    monkeypatch.setattr(fetch_edge, "_commit", commit)


def _fetched_then_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
                      at: int) -> tuple[Project, Path]:
    """Fetched at step 500, then fetched at step 700 and cut at the `at`-th rename into `where`."""
    project = _project(tmp_path)
    home = project.runs / RUN
    _trained_to(tmp_path, 500)
    assert main(RUN, None, False, project) == 0
    _trained_to(tmp_path, 700)
    with monkeypatch.context() as patched:
        _cut_at_commit(patched, home / where, at)
        with pytest.raises(KeyboardInterrupt):
            main(RUN, None, False, project)
    return project, home


def test_files_placed_before_a_cut_are_still_meshruns_at_the_next_fetch(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """Fetched at step 500; cut at step 700 after the host's manifest (with its small files) and
    best.pt (the first of its checkpoints) were moved into hosts/h2/checkpoints/; fetched again at
    step 900: both are replaced, nothing is "not overwritten", and the assembled best.pt is the
    host's newest."""
    project, home = _fetched_then_cut(tmp_path, monkeypatch, "hosts/h2/checkpoints", 3)
    assert (home / "hosts/h2/checkpoints/best.pt").read_bytes() == b"best at 650"  # moved in before the cut
    newest = _trained_to(tmp_path, 900)
    capsys.readouterr()
    assert main(RUN, None, False, project) == 0
    assert "not overwritten" not in capsys.readouterr().out
    tree = home / "hosts/h2/checkpoints"
    assert parse_manifest((tree / "MANIFEST.sha256").read_bytes()).digests() == newest
    assert (tree / "best.pt").read_bytes() == b"best at 850"
    assert (home / "checkpoints/best.pt").read_bytes() == b"best at 850"
    assert parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()["best.pt"] == newest["best.pt"]
    assert sorted(p.name for p in (home / ".placed").iterdir()) == ["h2.json"]  # the journal went with the record


def test_an_assembly_cut_before_its_manifest_leaves_best_pt_replaceable(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """Cut while `runs/<id>/checkpoints/` is assembled, after best.pt (first) replaced the one its
    manifest lists: the next fetch still takes that best.pt for meshrun's, replaces it with the
    host's newest and lists it."""
    project, home = _fetched_then_cut(tmp_path, monkeypatch, "checkpoints", 2)
    assert (home / "checkpoints/best.pt").read_bytes() == b"best at 650"
    newest = _trained_to(tmp_path, 900)
    capsys.readouterr()
    assert main(RUN, None, False, project) == 0
    assert "not overwritten" not in capsys.readouterr().out
    assert (home / "checkpoints/best.pt").read_bytes() == b"best at 850"
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert listed["best.pt"] == newest["best.pt"] and listed["ckpt-step000000900.pt"] == newest["ckpt-step000000900.pt"]
    assert sorted(p.name for p in (home / ".placed").iterdir()) == ["h2.json"]


def test_the_journal_counts_every_whole_line_and_skips_a_cut_one(tmp_path: Path) -> None:
    add = journal_to(tmp_path, "h2")
    add("train.log", "a" * 64)
    add("odd\nname\udcff", "b" * 64)
    add("train.log", "c" * 64)  # placed again: the later line wins
    with open(tmp_path / ".placed/h2.jsonl", "a") as handle:
        handle.write('["progress.json", "dd')  # cut mid-write
    assert read_journal(tmp_path, "h2") == {"train.log": "c" * 64, "odd\nname\udcff": "b" * 64}
    (tmp_path / ".placed/h2.json").write_text(json.dumps({"train.log": "e" * 64, "metrics.jsonl": "f" * 64}))
    assert read_placed(tmp_path, "h2") == {"train.log": "c" * 64, "metrics.jsonl": "f" * 64,
                                           "odd\nname\udcff": "b" * 64}
