"""`fab sync --data` hashing cut short keeps its work (deploy/edges/datasync.build_manifest), on real
files: a Ctrl-C after some files were hashed left no hash cache, and the next sync hashed the whole
dataset again. Only the hasher is wrapped, to count its calls and to raise where Ctrl-C would."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from meshrun.deploy.edges import datasync
from meshrun.deploy.edges.datasync import build_manifest, hash_cache_file

NAMES = ("a.bin", "b.bin", "c.bin", "d.bin", "e.bin")  # the order build_manifest hashes them in
REAL_SHA256 = datasync._sha256


@pytest.fixture
def src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Five files, and the user's cache and temporary folders fresh and outside SRC."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    data = tmp_path / "ds"
    data.mkdir()
    for i, name in enumerate(NAMES):
        (data / name).write_bytes(bytes([i]) * (1000 + i))
    return data


class Hasher:
    """The real hasher, counting the files it reads; the call numbered `interrupt_at` raises
    KeyboardInterrupt instead, as a Ctrl-C in the middle of that file would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, interrupt_at: int | None = None,
                 during: Callable[[int], None] | None = None) -> None:
        self.read: list[str] = []

        def sha256(path: str) -> str:
            if len(self.read) + 1 == interrupt_at:
                raise KeyboardInterrupt
            if during is not None:
                during(len(self.read))
            self.read.append(Path(path).name)
            return REAL_SHA256(path)

        monkeypatch.setattr(datasync, "_sha256", sha256)


def digests(src: Path) -> dict[str, str]:
    return {name: hashlib.sha256((src / name).read_bytes()).hexdigest() for name in NAMES}


def test_a_ctrl_c_after_three_files_leaves_two_to_hash(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Hasher(monkeypatch, interrupt_at=4)
    with pytest.raises(KeyboardInterrupt):
        build_manifest(src)
    assert first.read == ["a.bin", "b.bin", "c.bin"]
    cached = json.loads(hash_cache_file(src).read_text())["hashes"]
    assert {name: next(iter(v.values())) for name, v in cached.items()} == {
        name: digest for name, digest in digests(src).items() if name in first.read}
    again = Hasher(monkeypatch)
    assert build_manifest(src) == digests(src)
    assert again.read == ["d.bin", "e.bin"]
    assert Hasher(monkeypatch).read == [] and build_manifest(src) == digests(src)  # now whole: nothing to hash


def test_an_interrupted_rehash_keeps_the_cached_hashes_it_did_not_reach(src: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial save holds the old cache's entries too: saving this build's alone would drop b..d."""
    build_manifest(src)
    (src / "a.bin").write_bytes(b"changed a")
    (src / "e.bin").write_bytes(b"changed e")
    cut = Hasher(monkeypatch, interrupt_at=2)  # a.bin is hashed again, then Ctrl-C during e.bin
    with pytest.raises(KeyboardInterrupt):
        build_manifest(src)
    assert cut.read == ["a.bin"]
    again = Hasher(monkeypatch)
    assert build_manifest(src) == digests(src) and again.read == ["e.bin"]


def test_an_unreadable_file_keeps_the_hashes_before_it(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user makes the file readable and syncs again: only it, and what follows it, is read. (The
    refusal is raised by the wrapped hasher as open() raises it: root, as tests may run, reads any file.)"""
    def refuse(done: int) -> None:
        if done == 2:
            raise PermissionError(13, "Permission denied", str(src / "c.bin"))

    first = Hasher(monkeypatch, during=refuse)
    with pytest.raises(datasync.InputError, match="c.bin: permission denied"):
        build_manifest(src)
    assert first.read == ["a.bin", "b.bin"]
    again = Hasher(monkeypatch)
    assert build_manifest(src) == digests(src) and again.read == ["c.bin", "d.bin", "e.bin"]


def test_a_long_hash_saves_as_it_goes(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller killed outright, or a hash on a daemon thread that a Ctrl-C never unwinds, runs no
    `except`: what is on disk while the 4th file is read must already hold the first three."""
    monkeypatch.setattr(datasync, "CACHE_SAVE_EVERY_S", 0.0)
    monkeypatch.setattr(datasync, "SAVE_SPACING", 0)
    on_disk: list[set[str]] = []

    def look(done: int) -> None:
        if done == 3:
            on_disk.append(set(json.loads(hash_cache_file(src).read_text())["hashes"]))

    Hasher(monkeypatch, during=look)
    assert build_manifest(src) == digests(src)
    assert on_disk == [{"a.bin", "b.bin", "c.bin"}]
