"""How often a fetch reads each checkpoint to hash it. A periodic fetch during a long run (a new
checkpoint since the last one, the oldest pruned by the trainer's keep_last) read every checkpoint
still on the host eight times, and every step an earlier fetch brought once more: the staged copy
against the host's manifest, the staged copy and the copy here when placing it under hosts/<host>/,
twice while assembling runs/<id>/checkpoints/ (checked, then copied), the assembled copy and the one
it met there, and each file of checkpoints/ for its manifest. With 10 GB checkpoints that is minutes
of disk, against the 600 s the fetch allows itself after the transfer. Now the copies here are read
once and remembered while `lstat` says they are unchanged (deploy/edges/digestmemo.py). Real files,
real rsync from a local host (tests/localrun.py); the bytes are counted where every digest is made
(meshrun.fsutil's sha256)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from meshrun import fsutil
from meshrun.deploy.commands.fetch import main
from meshrun.deploy.run.manifest import manifest_text, parse_manifest
from tests.hashcount import CountingHashlib
from tests.localrun import local_h2_project

RUN = "20260101-000000-hash"
MIB = 1 << 20


def _saved(run: Path, steps: list[int]) -> dict[str, bytes]:
    """The host's checkpoints as the trainer leaves them (the steps it keeps, best.pt, the manifest);
    each checkpoint 1 MiB and more, so that the logs and manifests hashed beside them are noise."""
    folder = run / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    files = {f"ckpt-step{s:09d}.pt": random.Random(s).randbytes(MIB + s) for s in steps}
    files["best.pt"] = files[f"ckpt-step{steps[-1]:09d}.pt"]
    for old in folder.glob("ckpt-*"):
        if old.name not in files:
            old.unlink()
    for name, data in files.items():
        if not (folder / name).exists() or name == "best.pt":  # a step's file is written once
            (folder / name).write_bytes(data)
    (folder / "MANIFEST.sha256").write_text(manifest_text({n: hashlib.sha256(d).hexdigest() for n, d in files.items()}))
    (run / "train.log").write_text(f"trained to {steps[-1]}\n")
    return files


def test_a_periodic_fetch_reads_an_unchanged_checkpoint_once_and_a_new_one_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = local_h2_project(tmp_path, RUN)
    run, home = tmp_path / "w2/runs" / RUN, project.runs / RUN
    counted = CountingHashlib()
    monkeypatch.setattr(fsutil, "hashlib", counted)
    first = _saved(run, [100, 200, 300])
    assert main(RUN, None, False, project) == 0
    on_first = counted.hashed
    kept = {n: d for n, d in first.items() if n != "ckpt-step000000100.pt" and n != "best.pt"}
    counted.hashed = 0
    later = _saved(run, [200, 300, 400])  # the same bytes for 200 and 300; 400 and best.pt are new
    assert {n: later[n] for n in kept} == kept
    assert main(RUN, None, False, project) == 0
    new = {n: d for n, d in later.items() if n not in kept}
    # What the fetch still has to read: each staged copy once against the host's manifest (rsync made
    # it from the copy here: it is a new file), and a new one once more as it is copied into
    # checkpoints/. The copies here, the best.pt it replaces and the step the host pruned (still in
    # checkpoints/, still listed) are remembered from the first fetch, which placed them.
    floor = sum(len(kept[n]) for n in kept) + sum(2 * len(new[n]) for n in new)
    assert floor <= counted.hashed <= floor + 64 * 1024, (counted.hashed, floor, on_first)
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert listed == {n: hashlib.sha256(d).hexdigest() for n, d in {**first, **later}.items()
                      if n != "best.pt"} | {"best.pt": hashlib.sha256(later["best.pt"]).hexdigest()}
    assert all((home / "checkpoints" / n).read_bytes() == d for n, d in later.items())
    assert all((home / "hosts/h2/checkpoints" / n).read_bytes() == d for n, d in later.items())


def _edit_keeping_size_and_mtime(path: Path) -> None:
    """Other bytes of the same size, the modification time put back: only the change time tells."""
    before = os.lstat(path)
    data = bytearray(path.read_bytes())
    data[12345] ^= 0xFF
    with open(path, "r+b") as handle:  # in place: the same inode
        handle.write(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.lstat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_a_remembered_copy_edited_here_is_read_again_and_stays_yours(tmp_path: Path, capsys) -> None:
    project = local_h2_project(tmp_path, RUN)
    run, home = tmp_path / "w2/runs" / RUN, project.runs / RUN
    first = _saved(run, [100, 200, 300])
    assert main(RUN, None, False, project) == 0
    memo = json.loads((home / ".placed/.digests.json").read_text())
    assert sorted(memo) == sorted([f"checkpoints/{n}" for n in first] + [f"hosts/h2/checkpoints/{n}" for n in first])
    assert all(entry[1] == hashlib.sha256(first[name.rsplit("/", 1)[1]]).hexdigest() for name, entry in memo.items())
    _edit_keeping_size_and_mtime(home / "checkpoints/ckpt-step000000200.pt")
    _edit_keeping_size_and_mtime(home / "hosts/h2/checkpoints/ckpt-step000000300.pt")
    edited = {p: p.read_bytes() for p in (home / "checkpoints/ckpt-step000000200.pt",
                                           home / "hosts/h2/checkpoints/ckpt-step000000300.pt")}
    _saved(run, [200, 300, 400])
    capsys.readouterr()
    assert main(RUN, None, False, project) == 0
    said = " ".join(capsys.readouterr().out.split())
    for path in edited:
        assert f"not overwritten: {path} differs" in said, said
    assert all(p.read_bytes() == data for p, data in edited.items())  # yours, kept
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert "ckpt-step000000200.pt" not in listed  # no longer the verified bytes: not listed
    assert listed["ckpt-step000000300.pt"] == hashlib.sha256(first["ckpt-step000000300.pt"]).hexdigest()
