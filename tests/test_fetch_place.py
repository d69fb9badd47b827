"""The controller side of a fetch on real files, without the cluster: verifying a staged tree
against a hostile manifest, placing files without writing through links, and the staging tree's
upkeep. The cluster version (rsync from a planted hostile host) is tests/test_fetch_hostile.py."""

from __future__ import annotations

import os
from pathlib import Path

from meshrun.deploy.edges.fetch import FetchReport, Staging, place, prepare_staging, remove_staging, verify_checkpoints
from tests.hostile import Canary, sha256

SECRET = b"controller secret\n"


def test_hostile_manifest_lines_touch_no_controller_file(tmp_path: Path) -> None:
    canaries = [Canary.make(tmp_path / "controller" / f"c{i}", SECRET) for i in range(2)]
    tree = tmp_path / "tree"
    (tree / "checkpoints").mkdir(parents=True)
    (tree / "checkpoints/ckpt-step000000004.pt").write_bytes(b"good")
    (tree / "checkpoints/ckpt-stepXX.pt").write_bytes(b"xx")
    lines = [f"{'0' * 64}  {canaries[0].path}", f"{'0' * 64}  {'../' * 30}{str(canaries[1].path).lstrip('/')}",
             f"{sha256(b'xx')}  ckpt-stepXX.pt", f"{sha256(b'good')}  ckpt-step000000004.pt"]
    (tree / "checkpoints/MANIFEST.sha256").write_text("\n".join(lines) + "\n")
    report = FetchReport("h2", tmp_path / "landed")
    verify_checkpoints(tree, report)
    assert all(c.untouched() for c in canaries)
    assert report.corrupt == [] and report.verified == {"ckpt-step000000004.pt": sha256(b"good")}
    assert report.newest_step == 4
    assert [line.split(" ignored")[0] for line in report.refused] == [
        f"host 'h2': checkpoints/MANIFEST.sha256 line {n}" for n in (1, 2, 3)]


def test_a_corrupt_listed_checkpoint_is_deleted_from_staging_only(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "checkpoints").mkdir(parents=True)
    (tree / "checkpoints/best.pt").write_bytes(b"damaged")
    (tree / "checkpoints/MANIFEST.sha256").write_text(f"{sha256(b'whole')}  best.pt\n")
    report = FetchReport("h1", tmp_path / "landed")
    verify_checkpoints(tree, report)
    assert (report.corrupt, report.verified, report.newest_step) == (["checkpoints/best.pt"], {}, -1)
    assert not (tree / "checkpoints/best.pt").exists()


def test_place_never_writes_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = Canary.make(tmp_path / "canary", SECRET)
    source, target = tmp_path / "staged", tmp_path / "landed"
    (source / "checkpoints").mkdir(parents=True)
    (source / "checkpoints/best.pt").write_bytes(b"from the host")
    (source / "train.log").write_bytes(b"log")
    (source / "metrics.jsonl").write_bytes(b"{}")
    target.mkdir()
    (target / "checkpoints").symlink_to(outside)  # e.g. left by an older fetch
    (target / "train.log").symlink_to(canary.path)
    report = FetchReport("h3", target)
    place(source, target, report, force=True)
    assert os.listdir(outside) == [] and canary.untouched()
    assert report.refused == ["host 'h3': checkpoints/best.pt: a folder on its way here is a link or a file; "
                              "not placed"]
    assert (report.conflicts, report.new) == (["train.log"], ["metrics.jsonl"])
    assert (target / "metrics.jsonl").read_bytes() == b"{}" and not (source / "metrics.jsonl").exists()


def test_staging_keeps_partials_and_drops_what_is_not_a_regular_file(tmp_path: Path) -> None:
    staging = Staging(tmp_path / "h1")
    partial = staging.tree / "checkpoints/.rsync-partial/ckpt-step000000001.pt"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half")
    (staging.tree / "old-link").symlink_to("/etc/hostname")
    os.mkfifo(staging.tree / "checkpoints/pipe")
    (staging.tree / "done.txt").write_bytes(b"placed before a crash")
    staging.tmp.mkdir()
    (staging.tmp / "ckpt-step000000001.pt.Xy12Ab").write_bytes(b"temp of a killed rsync")
    prepare_staging(staging)
    assert sorted(str(p.relative_to(staging.root)) for p in staging.root.rglob("*")) == [
        "tmp", "tree", "tree/checkpoints", "tree/checkpoints/.rsync-partial",
        "tree/checkpoints/.rsync-partial/ckpt-step000000001.pt", "tree/done.txt"]
    remove_staging(staging)
    assert sorted(str(p.relative_to(staging.root)) for p in staging.root.rglob("*")) == [
        "tree", "tree/checkpoints", "tree/checkpoints/.rsync-partial",
        "tree/checkpoints/.rsync-partial/ckpt-step000000001.pt"]
