"""The controller side of a fetch on real files, without the cluster: verifying a staged tree
against a hostile manifest, placing files without writing through links, and the staging tree's
upkeep. The cluster version (rsync from a planted hostile host) is tests/test_fetch_hostile.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshrun.deploy.edges import fetch as fetch_module
from meshrun.deploy.edges.fetch import (FetchReport, Staging, fetch_argv, fetch_verified, prepare_staging,
                                        remove_staging, remove_tree, transfer, verify_checkpoints)
from meshrun.deploy.edges.fetchplace import place
from meshrun.deploy.edges.staging import MAX_DEPTH
from meshrun.deploy.edges.rsyncrun import run_rsync
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network
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


def _local_host(workdir: Path) -> Host:
    return Host(name="h1", address="local", ssh_address=None, user="ubuntu", port=22, identity=None,
                python="python3", workdir=str(workdir), network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())


@pytest.mark.parametrize("finishes", [True, False], ids=["save-finishes", "damaged"])
def test_a_checksum_mismatch_is_fetched_once_more_before_it_is_called_damaged(tmp_path: Path, monkeypatch,
                                                                             finishes: bool) -> None:
    """Real rsync from a local run directory caught mid-save: the manifest still lists the old
    `best.pt`, the file is already the new one (a live run saving while rsync reads). When the
    trainer's manifest follows before the second transfer, the fetch keeps the new `best.pt`; a
    copy that stays damaged is reported corrupt after the second transfer."""
    checkpoints = tmp_path / "wd/runs/r1/checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "ckpt-step000000002.pt").write_bytes(b"save 2")
    (checkpoints / "best.pt").write_bytes(b"save 2")
    (checkpoints / "MANIFEST.sha256").write_text(f"{sha256(b'save 1')}  best.pt\n")
    transfers = []

    def transfer_then_save(*args, **kwargs):
        skipped = real_transfer(*args, **kwargs)
        transfers.append(sorted(p.name for p in (staging.tree / "checkpoints").iterdir()))
        if finishes and len(transfers) == 1:  # the trainer's manifest lands after rsync read the old one
            (checkpoints / "MANIFEST.sha256").write_text(
                f"{sha256(b'save 2')}  best.pt\n{sha256(b'save 2')}  ckpt-step000000002.pt\n")
        return skipped

    real_transfer = fetch_module.transfer
    monkeypatch.setattr(fetch_module, "transfer", transfer_then_save)
    staging = Staging(tmp_path / "in/h1")
    prepare_staging(staging)
    report = FetchReport("h1", tmp_path / "landed")
    fetch_verified(fetch_argv(_local_host(tmp_path / "wd"), "r1", staging, tmp_path, None), staging, report,
                   lambda _host, _pct: None)
    assert len(transfers) == 2
    assert transfers[0] == ["MANIFEST.sha256", "best.pt", "ckpt-step000000002.pt"]
    if finishes:
        assert report.corrupt == [] and report.newest_step == 2
        assert report.verified == {"best.pt": sha256(b"save 2"), "ckpt-step000000002.pt": sha256(b"save 2")}
    else:
        assert (report.corrupt, report.verified) == (["checkpoints/best.pt"], {})
        assert not (staging.tree / "checkpoints/best.pt").exists()


def test_only_the_exit_statuses_named_succeed(tmp_path: Path) -> None:
    """rsync's exit 24 (a file vanished while it ran: a save the live trainer pruned) cannot be
    timed on demand, so a stand-in rsync exits with it."""
    vanishing = tmp_path / "rsync"
    vanishing.write_text("#!/bin/sh\necho 'file has vanished: \"ckpt-step000000001.pt\"' >&2\nexit 24\n")
    vanishing.chmod(0o755)
    argv = [str(vanishing)]
    run_rsync(argv, host="h1", what="fetch", timeout=30, hint="again", success=(0, 24))
    with pytest.raises(MeshrunError, match=r"^host 'h1': fetch failed \(rsync exit 24\): file has vanished"):
        run_rsync(argv, host="h1", what="fetch", timeout=30, hint="again")


def _chain(top: Path, depth: int, name: str = "d") -> Path:
    """`depth` nested folders under `top`, made one at a time (Python 3.11's os.makedirs recurses
    once per level); the deepest one."""
    for _ in range(depth):
        top = top / name
        top.mkdir()
    return top


def _deep_run(top: Path) -> None:
    """A run directory as a hostile host serves it: a log, a file 64 folders down (kept), and a
    chain of 1000 folders with a file at the bottom."""
    top.mkdir(parents=True)
    (top / "train.log").write_bytes(b"log")
    (_chain(top, MAX_DEPTH) / "ok").write_bytes(b"at the bound")
    (_chain(top / ("d/" * MAX_DEPTH), 1000 - MAX_DEPTH) / "bottom").write_bytes(b"too deep")


@pytest.fixture
def deep_tmp(tmp_path: Path):
    """tmp_path, emptied without recursion after the test, pass or fail: pytest's own clean-up of
    old temp dirs (shutil.rmtree) would meet a 1000-deep tree with a RecursionError."""
    yield tmp_path
    for child in list(tmp_path.iterdir()):
        remove_tree(child)


TOO_DEEP = ["host 'h1': " + "/".join(["d"] * (MAX_DEPTH + 1)) + ": a folder more than 64 levels deep; not placed"]


def test_a_thousand_nested_folders_are_refused_not_a_recursion_error(deep_tmp: Path) -> None:
    """Security review, item 5: the walk that places a staged tree keeps its own stack; what lies
    below MAX_DEPTH is reported (one line naming the host) and left in staging."""
    source, target = deep_tmp / "staged", deep_tmp / "landed"
    _deep_run(source)
    report = FetchReport("h1", target)
    place(source, target, report, force=False)
    assert (report.new, report.refused) == (["d/" * MAX_DEPTH + "ok", "train.log"], TOO_DEEP)
    assert (target / ("d/" * MAX_DEPTH + "ok")).read_bytes() == b"at the bound"
    assert not (target / ("d/" * (MAX_DEPTH + 1))).exists()
    assert (source / ("d/" * 1000 + "bottom")).read_bytes() == b"too deep"
    remove_tree(source)
    assert not source.exists()


def test_a_deep_staging_tree_left_behind_does_not_stop_the_next_fetch(deep_tmp: Path) -> None:
    """A staging tree of 1000 nested folders (left by an older meshrun's failed walk) is cut to
    MAX_DEPTH by the next fetch's preparation; partials stay, and removal clears the rest."""
    staging = Staging(deep_tmp / "h1")
    _deep_run(staging.tree)
    partial = staging.tree / "checkpoints/.rsync-partial/best.pt"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half")
    prepare_staging(staging)
    assert (staging.tree / ("d/" * MAX_DEPTH + "ok")).is_file() and partial.read_bytes() == b"half"
    assert os.listdir(staging.tree / ("d/" * MAX_DEPTH)) == ["ok"] and os.listdir(staging.tmp) == []
    _chain(staging.tree / ("d/" * MAX_DEPTH), 1000 - MAX_DEPTH)  # served again by the host
    remove_staging(staging)
    assert sorted(str(p.relative_to(staging.root)) for p in staging.root.rglob("*")) == [
        "tree", "tree/checkpoints", "tree/checkpoints/.rsync-partial", "tree/checkpoints/.rsync-partial/best.pt"]


def test_a_staging_tree_that_cannot_be_cleaned_goes_whole(tmp_path: Path) -> None:
    """A folder just below MAX_DEPTH whose path is longer than the system's limit (4096 bytes)
    cannot be removed by name: the staging tree is then removed whole, from its top, and the
    fetch starts afresh instead of failing here every time."""
    staging = Staging(tmp_path / "h1")
    staging.tree.mkdir(parents=True)
    width = (4000 - len(os.fsencode(staging.tree))) // MAX_DEPTH - 1  # the bound's folder: under 4000 bytes
    bottom = _chain(staging.tree, MAX_DEPTH, "x" * width)
    (bottom / "f").write_bytes(b"x")
    fd = os.open(bottom, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("y" * 255, dir_fd=fd)  # its path: over 4096 bytes
    finally:
        os.close(fd)
    prepare_staging(staging)
    assert (sorted(os.listdir(staging.root)), os.listdir(staging.tree)) == (["tmp", "tree"], [])


def test_a_hostile_deep_run_fetched_by_real_rsync_leaves_no_staging(deep_tmp: Path) -> None:
    """The whole fetch of one host on real files: rsync from a local run directory of 1000 nested
    folders, placing, then removing staging."""
    _deep_run(deep_tmp / "wd/runs/r1")
    staging = Staging(deep_tmp / "runs/r1/.incoming/h1")
    report = FetchReport("h1", deep_tmp / "runs/r1/hosts/h1")
    prepare_staging(staging)
    transfer(fetch_argv(_local_host(deep_tmp / "wd"), "r1", staging, deep_tmp, None), "h1", lambda _h, _p: None)
    place(staging.tree, report.landed, report, force=False)
    remove_staging(staging)
    assert (report.new, report.refused) == (["d/" * MAX_DEPTH + "ok", "train.log"], TOO_DEEP)
    assert not staging.root.exists()
