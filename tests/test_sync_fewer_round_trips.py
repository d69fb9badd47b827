"""`fab sync`'s cost per host (P4, bench/sync.py): each host is connected once, its busy question
and its data sync sharing the session, and a resync whose dataset keeps its names (unchanged, or a
file's bytes edited) asks the host for a digest of its old manifest's names instead of fetching the
whole file. The digest is the host's word: it decides only what is removed from that host's own
DEST. Real rsync and a real host-side python over a local host's session; the connects are
counted by standing in for the one function each path connects with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import sync as sync_cmd
from meshrun.deploy.edges import datastale
from meshrun.deploy.edges.datastale import OLD_NAMES, names_digest
from meshrun.deploy.edges.datasync import DATA_MANIFEST, build_manifest, manifest_bytes
from meshrun.deploy.edges.transport import CommandResult, LocalSession
from meshrun.deploy.project import Project
from tests.clirun import git_project
from tests.datalocal import homes, sync  # noqa: F401 (homes: the autouse fixture)


def dataset(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for name in ("cat/1.png", "dog/1.png", "é ü.bin"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    return src


def test_the_hosts_digest_of_its_manifests_names_is_the_controllers(tmp_path: Path) -> None:
    src = dataset(tmp_path)
    manifest = build_manifest(src)
    (tmp_path / DATA_MANIFEST).write_bytes(manifest_bytes(manifest) + b"not a manifest line\n")
    said = subprocess.run([sys.executable, "-c", OLD_NAMES, str(tmp_path), DATA_MANIFEST], capture_output=True,
                          text=True, check=True).stdout
    assert said.strip() == f'"{names_digest(manifest)}"'
    assert names_digest(manifest) != names_digest({**manifest, "gone.png": "0" * 64})
    (tmp_path / DATA_MANIFEST).unlink()
    (tmp_path / DATA_MANIFEST).symlink_to(tmp_path / "elsewhere")  # never followed: no manifest there
    assert subprocess.run([sys.executable, "-c", OLD_NAMES, str(tmp_path), DATA_MANIFEST], capture_output=True,
                          text=True, check=True).stdout.strip() == "null"


def test_an_edited_file_skips_the_old_manifests_fetch_a_removed_one_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = dataset(tmp_path)
    sync(src, tmp_path)
    fetched: list[str] = []
    real = datastale.run_rsync

    def counted(argv, **kwargs):  # type: ignore[no-untyped-def]
        if argv[-2].endswith(DATA_MANIFEST):  # fetch_manifest_argv: DEST's manifest into the staging folder
            fetched.append(argv[-2])
        return real(argv, **kwargs)

    monkeypatch.setattr(datastale, "run_rsync", counted)
    (src / "cat/1.png").write_bytes(b"edited")
    assert sync(src, tmp_path).transferred == ("cat/1.png",)
    assert fetched == []
    (src / "dog/1.png").unlink()
    result = sync(src, tmp_path)
    assert (result.removed, len(fetched)) == (1, 1)
    assert not (tmp_path / "wd/data/ds/dog/1.png").exists()


def test_a_host_that_lies_same_names_keeps_only_its_own_stale_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = dataset(tmp_path)
    sync(src, tmp_path)
    (src / "dog/1.png").unlink()
    real_run = LocalSession.run

    def lying(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        if OLD_NAMES in argv:
            return CommandResult(0, f'"{names_digest(build_manifest(src))}"\n', "")
        return real_run(self, argv, **kwargs)

    monkeypatch.setattr(LocalSession, "run", lying)
    result = sync(src, tmp_path)
    assert result.removed == 0 and (tmp_path / "wd/data/ds/dog/1.png").exists()
    assert result.files == 2  # what SRC has is still sent and verified


@pytest.mark.parametrize("answer", ["", "[1]", '"' + "0" * 64 + '"', '{"digest": 1}'])
def test_any_other_answer_fetches_the_old_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   answer: str) -> None:
    src = dataset(tmp_path)
    sync(src, tmp_path)
    (src / "dog/1.png").unlink()
    real_run = LocalSession.run
    monkeypatch.setattr(LocalSession, "run", lambda self, argv, **kw: CommandResult(0, answer, "")
                        if OLD_NAMES in argv else real_run(self, argv, **kw))
    assert sync(src, tmp_path).removed == 1


def test_fab_sync_connects_each_host_once_for_its_busy_question_and_its_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = git_project(tmp_path)
    (root / "train.py").write_text("print('hi')\n")
    (root / "hosts.yaml").write_text(f"hosts:\n  h1: {{address: local, workdir: {tmp_path / 'wd1'}}}\n")
    src = dataset(tmp_path)
    opened: list[str] = []
    real_init = LocalSession.__init__

    def counted(self, host, project_root):  # type: ignore[no-untyped-def]
        opened.append(host.name)
        real_init(self, host, project_root)

    monkeypatch.setattr(LocalSession, "__init__", counted)  # every session to a local host is one
    sync_cmd.main(str(root / "hosts.yaml"), None, f"{src}:data/d", Project(root, root / "runs"))
    assert opened == ["h1"]
    assert (tmp_path / "wd1/data/d/cat/1.png").read_bytes() == b"cat/1.png"


def test_a_file_edited_within_the_second_of_the_last_sync_arrives(tmp_path: Path) -> None:
    """rsync's quick check compares size and whole seconds: the new manifest (the same size, one hash
    new) staged in the same second as the last one was taken for it, so DEST kept the old hashes, and
    an edit of the same size was neither sent nor caught by the verification."""
    src = dataset(tmp_path)
    sync(src, tmp_path)
    was = (src / "cat/1.png").stat()
    (src / "cat/1.png").write_bytes(b"cat/2.png")  # the same size, in the same whole second: rsync skips it
    second, fraction = divmod(was.st_mtime_ns, 10**9)
    os.utime(src / "cat/1.png", ns=(was.st_atime_ns, second * 10**9 + (fraction + 1) % 10**9))
    time.sleep(1.05 - time.time() % 1)  # just past a second's start: the old and the new manifest share it
    os.utime(tmp_path / "wd/data/ds" / DATA_MANIFEST)
    result = sync(src, tmp_path)
    assert (tmp_path / "wd/data/ds/cat/1.png").read_bytes() == b"cat/2.png"
    assert result.repaired == ("cat/1.png",)  # skipped by the quick check, caught by its new hash
    assert (tmp_path / "wd/data/ds" / DATA_MANIFEST).read_bytes() == manifest_bytes(build_manifest(src))
