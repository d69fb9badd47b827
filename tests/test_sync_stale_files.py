"""What left the project leaves the hosts (the sync-data review, findings 1 and 6).

A file the project no longer has (`git rm`, a rename, a file now ignored) stayed in every host's
workdir forever: after `net/__init__.py` became `net.py` the host still imported the old package,
and the code check called the workdir "already this project's". Now each code sync sends its list
of names with the code, and once rsync succeeded the names the workdir's record holds and the new
list lacks are removed there (deploy/run/syncset.py PRUNE_SH), nothing else: the venv, runs and
data a workdir holds were never sent and are never touched. A tracked link to a path only the hosts
have is sent as a link.

Real git, real rsync, a local host's workdir and a "remote" one reached through a stand-in ssh
(`sh -c` on this machine, as sshd runs the command rsync's ssh starts on a host).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.layout import SHIPPED_LIST
from meshrun.deploy.edges import sync
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.run.syncset import PRUNE_SH

STAND_IN_SSH = """#!/bin/sh
# rsync's ssh: `HOST COMMAND...` run by sh here, as sshd runs it on the host.
shift
exec sh -c "$*"
"""
ODD = ["new\nline.py", "ünï.py", "back\\slash.py", "sp ace/%b\\c.py", "-dash.py"]  # removed as any other


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    return root


@pytest.fixture(params=["local", "remote"])
def host_of(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A host whose workdir is the folder given: this machine's, or one rsync reaches through ssh."""
    ssh = tmp_path / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(0o755)
    monkeypatch.setattr(sync, "ssh_argv", lambda host, known_hosts: [str(ssh)])
    address = "local" if request.param == "local" else "10.9.0.2"
    return lambda workdir: Host("h1", address, None, None, None, None, None, str(workdir), Network.LAN, None, None,
                                None, ())


def push(root: Path, host: Host, files: bytes | None = None) -> sync.SyncResult:
    files = sync.project_files(root) if files is None else files
    return sync.sync_host(host, root, None, files, lambda h, p: None, 60)


def tree(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, names in os.walk(root) for n in dirs + names)


def held(workdir: Path, files: bytes) -> str:
    """The host's answer to the code check (deploy/host/codestat.py, run as the host runs it)."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", Path(codestat.__file__).read_text()], cwd=workdir,
                          input=files, capture_output=True, check=True).stdout.decode().strip()


def test_a_renamed_package_s_old_copy_is_removed_and_nothing_the_sync_did_not_send(tmp_path: Path, host_of) -> None:
    root = project(tmp_path / "proj", {"train.py": "import net\nprint(net.X)\n", "net/__init__.py": "X = 'OLD'\n",
                                       "notes.txt": "n", **{name: "odd" for name in ODD}})
    workdir = tmp_path / "wd"
    for mine in (".venv/bin/python", "runs/r1/train.log", "data/c10/a.bin", "notes.txt.host"):  # the host's own
        (workdir / mine).parent.mkdir(parents=True, exist_ok=True)
        (workdir / mine).write_text("host's")
    push(root, host_of(workdir))
    theirs = [n for n in tree(workdir) if n.startswith((".venv", "runs", "data", "notes.txt.host"))]
    assert (workdir / "net" / "__init__.py").exists() and all((workdir / n).exists() for n in ODD)

    git(root, "rm", "-rq", "--", "net", *ODD)  # the package is a module now; the odd names are gone
    (root / "net.py").write_text("X = 'NEW'\n")
    (root / ".gitignore").write_text("notes.txt\n")  # now ignored: no host gets it any more
    git(root, "rm", "-q", "--cached", "notes.txt")
    files = sync.project_files(root)
    assert files == b".gitignore\0net.py\0train.py\0"
    assert push(root, host_of(workdir)).files == 3

    ran = subprocess.run([sys.executable, "train.py"], cwd=workdir, capture_output=True, text=True, check=True)
    assert ran.stdout == "NEW\n"
    assert not (workdir / "net" / "__init__.py").exists() and not (workdir / "notes.txt").exists()
    assert not any(os.path.lexists(workdir / n) for n in ODD)
    assert [n for n in tree(workdir) if n.startswith((".venv", "runs", "data", "notes.txt.host"))] == theirs
    assert codestat.recorded((workdir / SHIPPED_LIST).read_bytes()) == {b".gitignore", b"net.py", b"train.py"}
    assert held(workdir, files) == codestat.digest(os.fsencode(root), files.split(b"\0")[:-1])


def test_a_removal_never_follows_a_link_put_in_a_folder_s_place(tmp_path: Path, host_of) -> None:
    root = project(tmp_path / "proj", {"train.py": "", "pkg/a.py": "A", "pkg/deep/b.py": "B"})
    workdir, elsewhere = tmp_path / "wd", tmp_path / "elsewhere"
    push(root, host_of(workdir))
    (elsewhere / "deep").mkdir(parents=True)
    for name in ("a.py", "deep/b.py"):
        (elsewhere / name).write_text("the host user's")
    os.rename(workdir / "pkg", tmp_path / "old-pkg")
    (workdir / "pkg").symlink_to(elsewhere)  # the host's user put a link where the folder was
    git(root, "rm", "-rq", "pkg")
    push(root, host_of(workdir))
    assert (elsewhere / "a.py").read_text() == (elsewhere / "deep" / "b.py").read_text() == "the host user's"
    assert os.readlink(workdir / "pkg") == str(elsewhere)
    assert codestat.recorded((workdir / SHIPPED_LIST).read_bytes()) == {b"train.py"}  # not its to remove again


def test_the_record_changes_only_after_a_transfer_that_succeeded(tmp_path: Path, host_of) -> None:
    root = project(tmp_path / "proj", {"train.py": "", "old.py": ""})
    workdir = tmp_path / "wd"
    push(root, host_of(workdir))
    before = (workdir / SHIPPED_LIST).read_bytes()
    assert codestat.recorded(before) == {b"old.py", b"train.py"}
    git(root, "rm", "-q", "old.py")
    (root / "model.py").write_text("")
    (workdir / "model.py" / "cache").mkdir(parents=True)  # the host's folder where a file must go: rsync exits 23
    files = sync.project_files(root)
    with pytest.raises(MeshrunError, match="code sync failed"):
        push(root, host_of(workdir), files)
    assert (workdir / SHIPPED_LIST).read_bytes() == before and (workdir / "old.py").exists()
    assert held(workdir, files) == codestat.NOT_LAST  # its old.py: not this project's code as it is
    (workdir / "model.py" / "cache").rmdir()
    push(root, host_of(workdir), files)
    assert not (workdir / "old.py").exists()
    assert held(workdir, files) == codestat.digest(os.fsencode(root), [b"model.py", b"train.py"])


def test_the_code_check_says_sync_while_the_workdir_holds_a_file_the_project_lost(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    (tmp_path / "old.py").write_text("stale")
    digest = codestat.digest(os.fsencode(tmp_path), [b"a.py"])
    assert held(tmp_path, b"a.py\0") == codestat.NOT_LAST  # no record: synced by an older meshrun, or never
    (tmp_path / SHIPPED_LIST).write_bytes(codestat.record_of([b"a.py", b"old.py"]))
    assert held(tmp_path, b"a.py\0") == codestat.NOT_LAST
    (tmp_path / SHIPPED_LIST).write_bytes(codestat.record_of([b"a.py"]))
    assert held(tmp_path, b"a.py\0") == digest
    (tmp_path / SHIPPED_LIST).unlink()
    (tmp_path / SHIPPED_LIST).symlink_to(tmp_path / "elsewhere")
    assert held(tmp_path, b"a.py\0") == codestat.NOT_LAST
    assert codestat.SHIPPED_LIST == SHIPPED_LIST  # the host's copy of the name


def test_a_record_holds_every_name_and_the_host_s_shell_reads_each_back(tmp_path: Path) -> None:
    names = [os.fsencode(n) for n in ODD] + [b"\xff\x01raw", b"a\\0101", b"plain/x.py"]
    record = codestat.record_of(names + names[:2])
    assert all(32 <= c < 127 or c == 10 for c in record) and record.count(b"\n") == len(names)
    assert codestat.recorded(record) == set(names)
    for line in record.splitlines():
        read = subprocess.run(["sh", "-c", 'n=$(printf "%bx" "$1"); printf %s "${n%x}"', "sh", line],
                              capture_output=True, check=True).stdout
        assert read in names


def test_a_record_naming_what_no_sync_sends_removes_nothing_it_should_not(tmp_path: Path) -> None:
    """The record is the host's: an honest host's is meshrun's, but whatever it says, only names that
    are files inside the workdir, reached through folders, are removed; its own files never."""
    outside = tmp_path / "outside"
    outside.write_text("keep")
    workdir = tmp_path / "wd"
    (workdir / "sub").mkdir(parents=True)
    for name in ("keep.py", "sub/gone.py", ".meshrun-project", "dir/x"):
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text("")
    listed = [b"../outside", os.fsencode(str(outside)), b"sub/../keep.py", b"./keep.py", b"sub//gone.py", b"dir",
              b".meshrun-project", b"sub/gone.py", b""]
    (workdir / SHIPPED_LIST).write_bytes(codestat.record_of(listed))
    (workdir / f"{SHIPPED_LIST}.new").write_bytes(codestat.record_of([b"keep.py"]))
    subprocess.run(["sh", "-c", PRUNE_SH], cwd=workdir, check=True)
    assert outside.read_text() == "keep"
    assert tree(workdir) == [".meshrun-files", ".meshrun-project", "dir", "dir/x", "keep.py", "sub"]
    assert (workdir / SHIPPED_LIST).read_bytes() == b"keep.py\n"


def test_a_tracked_link_to_a_path_only_the_hosts_have_is_sent_as_a_link(tmp_path: Path, host_of) -> None:
    root = project(tmp_path / "proj", {"train.py": ""})
    (root / "data").symlink_to("/scratch/nowhere-here/imagenet")
    git(root, "add", "data")
    git(root, "commit", "-qm", "link")
    assert sync.project_files(root) == b"data\0train.py\0"
    workdir = tmp_path / "wd"
    push(root, host_of(workdir))
    assert os.readlink(workdir / "data") == "/scratch/nowhere-here/imagenet"


def test_meshrun_s_own_workdir_files_in_a_project_stay_home(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", {"train.py": "", SHIPPED_LIST: "x", f"{SHIPPED_LIST}.new": "y",
                                       f"sub/{SHIPPED_LIST}": "z"})
    assert sync.project_files(root) == f"sub/{SHIPPED_LIST}\0train.py\0".encode()
