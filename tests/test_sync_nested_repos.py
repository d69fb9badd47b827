"""Git repositories inside the project reach the hosts file by file (the sync-data review, findings 2 and 3).

git lists an untracked clone inside the project as one entry, `vendored/`, and a submodule as its
gitlink, `third_party/sub`. rsync sent the clone's top level unfiltered (its SSH key, its
known_hosts, the inventory in use) with its subfolders empty, and the submodule as an empty folder;
the code check saw neither folder's files change. Now each is listed by its own git, every file
through the same private-file rule, named from that repository's top as well as the project's.

Real git, real rsync, a local host's workdir.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.edges import sync
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.run.syncset import is_private

CLONE = {"mod.py": "Y = 1\n", "pkg/__init__.py": "", "pkg/mod.py": "Z = 1\n", "id_ed25519": "PRIVATE KEY",
         "known_hosts": "gpu1 ssh-ed25519 AAAA", "keys/id_rsa": "PRIVATE", "inventory/hosts.yaml": "hosts: {}",
         "hosts.yaml": "the inventory in use"}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always", *args],
                   cwd=root, check=True, capture_output=True)


def repository(root: Path, files: dict[str, str], *, commit: bool = True) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    if commit:
        git(root, "add", "-A")
        git(root, "commit", "-qm", "first")
    return root


def local(workdir: Path) -> Host:
    return Host("h1", "local", None, None, None, None, None, str(workdir), Network.LAN, None, None, None, ())


def listed(files: bytes) -> list[str]:
    return [os.fsdecode(n) for n in files.split(b"\0") if n]


def listed_bytes(files: bytes) -> list[bytes]:
    return [n for n in files.split(b"\0") if n]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_untracked_clone_ships_its_files_and_its_keys_stay_home(tmp_path: Path) -> None:
    root = repository(tmp_path / "proj", {"train.py": ""})
    repository(root / "vendored", CLONE)  # cloned in, never added: git lists it as `vendored/`
    files = sync.project_files(root, (root / "vendored" / "hosts.yaml",))  # the inventory in use lies there
    assert listed(files) == ["train.py", "vendored/mod.py", "vendored/pkg/__init__.py", "vendored/pkg/mod.py"]
    assert not [n for n in listed(files) if n.endswith("/") or is_private(n)]

    workdir = tmp_path / "wd"
    sync.sync_host(local(workdir), root, None, files, lambda h, p: None, 60)
    assert sha(workdir / "vendored" / "pkg" / "mod.py") == sha(root / "vendored" / "pkg" / "mod.py")
    for private in ("id_ed25519", "known_hosts", "hosts.yaml", "keys", "inventory", ".git"):
        assert not os.path.lexists(workdir / "vendored" / private), private

    before = codestat.digest(os.fsencode(root), listed_bytes(files))
    (root / "vendored" / "pkg" / "mod.py").write_text("Z = 22\n")  # an edit inside the clone: the check sees it
    assert codestat.digest(os.fsencode(root), listed_bytes(sync.project_files(root))) != before


def test_a_submodule_s_files_arrive_and_its_folder_is_no_entry_of_its_own(tmp_path: Path) -> None:
    upstream = repository(tmp_path / "sub", {"lib.py": "def f():\n    return 1\n", "id_ed25519": "KEY",
                                            "inner/x.py": "X = 1\n"})
    root = repository(tmp_path / "proj", {"train.py": "from third_party.sub import lib\n"})
    git(root, "submodule", "add", "-q", str(upstream), "third_party/sub")
    git(root, "commit", "-qm", "sub")
    (root / "third_party" / "sub" / "scratch.py").write_text("")  # untracked in it, not ignored: as the project's
    files = sync.project_files(root)
    assert listed(files) == [".gitmodules", "third_party/sub/inner/x.py", "third_party/sub/lib.py",
                             "third_party/sub/scratch.py", "train.py"]
    workdir = tmp_path / "wd"
    sync.sync_host(local(workdir), root, None, files, lambda h, p: None, 60)
    assert sha(workdir / "third_party" / "sub" / "lib.py") == sha(upstream / "lib.py")
    assert not os.path.lexists(workdir / "third_party" / "sub" / "id_ed25519")


def test_a_submodule_not_checked_out_and_a_clone_in_a_clone(tmp_path: Path) -> None:
    upstream = repository(tmp_path / "sub", {"lib.py": ""})
    root = repository(tmp_path / "proj", {"train.py": ""})
    git(root, "submodule", "add", "-q", str(upstream), "third_party/sub")
    git(root, "commit", "-qm", "sub")
    git(root, "submodule", "deinit", "-f", "third_party/sub")  # its folder is there, empty
    repository(root / "a", {"a.py": ""}, commit=False)
    repository(root / "a" / "b", {"b.py": "", "id_rsa": ""}, commit=False)
    assert listed(sync.project_files(root)) == [".gitmodules", "a/a.py", "a/b/b.py", "train.py"]


def test_repositories_past_the_bound_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = repository(tmp_path / "proj", {"train.py": ""})
    repository(root / "vendored", {"mod.py": ""})
    monkeypatch.setattr(sync, "NESTED_MAX", 0)
    with pytest.raises(MeshrunError) as refused:
        sync.project_files(root)
    assert str(refused.value) == (f"{root / 'vendored'}: more git repositories inside the project than meshrun lists "
                                  "(0, 8 deep at most); add those hosts need not get to .gitignore")
