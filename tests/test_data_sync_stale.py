"""`fab sync --data`: a file removed from SRC is removed from DEST on the next sync (an ImageFolder
on the host must stop training on deleted images), and nothing else at DEST is: only names the
previous sync's manifest at DEST recorded, that SRC no longer has, under DEST and never through a
link. The old manifest is the host's word, so its names are checked first. Real rsync, a local
host's workdir (the same argv as a remote one, minus `-e ssh`), no cluster."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from meshrun.deploy.edges.datastale import removal_answer
from meshrun.deploy.edges.datasync import DATA_MANIFEST, build_manifest
from meshrun.deploy.edges.transport import CommandResult, LocalSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.dataplan import listing_size, manifest_names, old_bound, stale_names
from tests.datalocal import homes, sync  # noqa: F401 (homes: the autouse fixture)


def tree(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(top, n), root) for top, dirs, files in os.walk(root) for n in dirs + files}


def dataset(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name in ("cat/1.png", "cat/2.png", "dog/1.png", "bird/only.png", "a.bin"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    return src


def test_files_deleted_from_src_leave_dest_and_nothing_else_does(tmp_path: Path) -> None:
    src = dataset(tmp_path)
    first = sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    (dest / "cat" / "notes.txt").write_text("the host's own file\n")  # never meshrun's: it stays
    (dest / "scratch").mkdir()
    (dest / "scratch" / "cache.pt").write_bytes(b"host's")
    (src / "cat" / "2.png").unlink()  # the researcher deletes mislabeled images, and a whole class
    (src / "bird" / "only.png").unlink()
    (src / "bird").rmdir()

    again = sync(src, tmp_path)
    # The emptied class folder goes too (ImageFolder fails on an empty class); a folder that still holds
    # the host's file stays.
    assert tree(dest) == {DATA_MANIFEST, "a.bin", "cat", "cat/1.png", "cat/notes.txt", "dog", "dog/1.png",
                          "scratch", "scratch/cache.pt"}
    assert (again.files, again.removed, again.transferred, again.repaired) == (3, 2, (), ())
    assert first.removed == 0 and sync(src, tmp_path).removed == 0  # the new manifest no longer lists them


def test_the_hosts_old_manifest_removes_only_safe_names_under_dest(tmp_path: Path) -> None:
    """The host wrote the old manifest: names that climb out, are absolute, pass through a link, or
    that SRC still has (a link rsync sends as a link) are never removed; a plain stale one is."""
    src = dataset(tmp_path)
    (src / "keep-link").symlink_to("a.bin")  # SRC still has it; as a link, not a manifest name
    sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    for name in ("victim.bin", "deep/victim.bin"):
        (outside / name).write_bytes(b"not meshrun's")
    (dest / "through").symlink_to(outside)  # a link at DEST: nothing beyond it is DEST's
    (dest / "stale.bin").write_bytes(b"sent by a sync long ago")
    names = ["through/victim.bin", "through/deep/victim.bin", "../outside/victim.bin", f"{outside}/victim.bin",
             "cat/../../outside/victim.bin", "./a.bin", "cat//1.png", "keep-link", "stale.bin", "cat"]
    old = (dest / DATA_MANIFEST).read_bytes() + b"".join(f"{'0' * 64}  {n}\n".encode() for n in names)
    (dest / DATA_MANIFEST).write_bytes(old)

    result = sync(src, tmp_path)
    assert not (dest / "stale.bin").exists() and result.removed == 1
    assert (outside / "victim.bin").read_bytes() == (outside / "deep/victim.bin").read_bytes() == b"not meshrun's"
    assert (dest / "keep-link").is_symlink() and (dest / "cat").is_dir() and (dest / "cat/1.png").is_file()


def test_a_linked_manifest_at_dest_is_not_followed(tmp_path: Path) -> None:
    src = dataset(tmp_path)
    sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    (dest / "stale.bin").write_bytes(b"old")
    elsewhere = tmp_path / "elsewhere.sha256"
    elsewhere.write_bytes((dest / DATA_MANIFEST).read_bytes() + f"{'0' * 64}  stale.bin\n".encode())
    (dest / DATA_MANIFEST).unlink()
    (dest / DATA_MANIFEST).symlink_to(elsewhere)
    result = sync(src, tmp_path)
    assert (dest / "stale.bin").exists() and result.removed == 0
    # A manifest that is a file again is read: the stale name it lists goes.
    (dest / DATA_MANIFEST).unlink()
    (dest / DATA_MANIFEST).write_bytes(elsewhere.read_bytes())
    result = sync(src, tmp_path)
    assert not (dest / "stale.bin").exists() and result.removed == 1


def test_stale_names_are_checked_and_compared_exactly() -> None:
    data = b"".join(f"{'a' * 64}  {n}\n".encode() for n in (
        "x/old.png", "new.png", "../up", "/abs", "a//b", "a/./b", "", "in-src", ".meshrun-manifest.sha256",
        "sub/.meshrun-partial/p", "n" * 256, "ok/" + "n" * 255)) + b"garbage line\n" + b"a" * 64 + b"  bad-\xff\n"
    names = list(manifest_names(data.split(b"\n")))
    assert names == ["x/old.png", "new.png", "in-src", "ok/" + "n" * 255]
    assert stale_names(names + ["x/old.png", "../z"], {"new.png": "a" * 64}, lambda n: n == "in-src") == \
        ("ok/" + "n" * 255, "x/old.png")


def test_the_hosts_removal_answer_is_bounded_and_quoted() -> None:
    group = ("a.png", "b.png")
    ok = CommandResult(0, '{"removed": 1, "failed": [["b.png", "Permission denied"], ["/etc/x", "nope"]]}\n', "")
    assert removal_answer("gpu1", ok, group) == (1, ["b.png (Permission denied)"])
    lying = CommandResult(0, '{"removed": 3, "failed": []}\n', "")
    with pytest.raises(MeshrunError) as err:
        removal_answer("gpu1", lying, group)
    assert str(err.value) == "host 'gpu1': the removal of files SRC no longer has gave an unexpected answer: " \
                             "removed is 3; expected a count from 0 to 2"
    broken = CommandResult(1, "", "Traceback\nOSError: \x1b[31mboom\n")
    with pytest.raises(MeshrunError) as err:
        removal_answer("gpu1", broken, group)
    assert str(err.value) == "host 'gpu1': could not remove files SRC no longer has: Traceback\\nOSError: \\x1b[31mboom"


def test_what_cannot_be_removed_stops_before_the_transfer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old manifest stays at DEST, so the next sync still knows what to remove."""
    src = dataset(tmp_path)
    sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    (src / "a.bin").unlink()
    (src / "new.bin").write_bytes(b"new")
    before = (dest / DATA_MANIFEST).read_bytes()
    real_run = LocalSession.run

    def refusing(self, argv, **kw):  # the host's answer when a file cannot be removed (root ignores modes)
        if "removed" in argv[2]:
            return CommandResult(0, '{"removed": 0, "failed": [["a.bin", "Operation not permitted"]]}\n', "")
        return real_run(self, argv, **kw)

    monkeypatch.setattr(LocalSession, "run", refusing)
    with pytest.raises(MeshrunError) as err:
        sync(src, tmp_path)
    assert str(err.value) == "host 'local': could not remove 1 files SRC no longer has from data/ds: a.bin " \
                             "(Operation not permitted); make them removable there (or remove them), then sync again"
    assert (dest / DATA_MANIFEST).read_bytes() == before and not (dest / "new.bin").exists()
    monkeypatch.setattr(LocalSession, "run", real_run)
    result = sync(src, tmp_path)
    assert not (dest / "a.bin").exists() and result.removed == 1
    assert hashlib.sha256((dest / "new.bin").read_bytes()).hexdigest() == build_manifest(src)["new.bin"]


def test_a_hosts_huge_old_manifest_costs_the_controller_little_and_removes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compromised host's DEST manifest of a million names SRC never had (75 MB): before, the
    controller read it whole, kept every name and sent hundreds of removal commands; now it is larger
    than this SRC's listing explains, so it is not even fetched, and the result says so."""
    src = dataset(tmp_path)
    sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    (dest / "h").mkdir()
    for n in range(3):
        (dest / "h" / f"{n:x}").write_bytes(b"the host's own")
    with open(dest / DATA_MANIFEST, "ab") as manifest:
        manifest.writelines(b"0" * 64 + b"  h/%x\n" % n for n in range(1_000_000))
    removals = []
    real_run = LocalSession.run

    def spied(self, argv, **kw):
        if "removed" in argv[2]:
            removals.append(argv)
        return real_run(self, argv, **kw)

    monkeypatch.setattr(LocalSession, "run", spied)
    tracemalloc.start()
    try:
        result = sync(src, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20 and removals == [] and result.removed == 0
    assert result.notes == (f"data data/ds: the {DATA_MANIFEST} a previous sync left there is over 8 MiB, more than "
                            "this SRC's listing explains, so it was not read and nothing was removed; delete there "
                            "what SRC no longer has (or that file), then sync again",)
    assert tree(dest) >= {"h/0", "h/1", "h/2", "a.bin"}
    # The new manifest took its place: the next sync reads it, and says nothing.
    assert (dest / DATA_MANIFEST).stat().st_size < 1000 and sync(src, tmp_path).notes == ()


def test_the_old_manifest_is_read_line_by_line(tmp_path: Path) -> None:
    """A line longer than any meshrun writes is skipped, not held, and the lines after it still count."""
    src = dataset(tmp_path)
    sync(src, tmp_path)
    dest = tmp_path / "wd" / "data" / "ds"
    (dest / "stale.bin").write_bytes(b"old")
    (dest / ("x" * 200)).write_bytes(b"old")
    with open(dest / DATA_MANIFEST, "ab") as manifest:
        manifest.write(b"0" * 64 + b"  " + b"x/" * 3000 + b"\n" + b"0" * 64 + b"  stale.bin\n" + b"0" * 64 + b"  " +
                       b"x" * 200)  # the last line without its newline
    result = sync(src, tmp_path)
    assert result.removed == 2 and not (dest / "stale.bin").exists() and not (dest / ("x" * 200)).exists()


def test_how_much_old_manifest_is_read_follows_the_srcs_own_listing(tmp_path: Path) -> None:
    """Twice the larger of the new listing and the one of SRC's last build (its hash cache): a dataset
    cut to a subset still has the rest removed; never under 8 MiB, never over 256 MiB, whole MiB."""
    assert [old_bound(n) for n in (0, 4 << 20, (5 << 20) + 1, 100 << 20, 1 << 40)] == \
        [8 << 20, 8 << 20, 11 << 20, 200 << 20, 256 << 20]
    assert listing_size(["a.bin", "é"]) == 67 * 2 + 5 + 2
    src = dataset(tmp_path)
    assert build_manifest(src).before == 0  # no build before: nothing known
    before = sorted(build_manifest(src))
    (src / "cat" / "2.png").unlink()
    assert build_manifest(src).before == listing_size(before) and len(before) == 5
