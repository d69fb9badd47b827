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
import struct
import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.commands.sync import code_files
from meshrun.deploy.edges import gitlist, sync
from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.fetchplace import place
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project
from meshrun.deploy.run.syncset import is_private, kept_home

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
    monkeypatch.setattr(gitlist, "NESTED_MAX", 0)
    with pytest.raises(MeshrunError) as refused:
        sync.project_files(root)
    assert str(refused.value) == (f"{root / 'vendored'}: more git repositories inside the project than meshrun lists "
                                  "(0, 8 deep at most); add those hosts need not get to .gitignore")


# A nested repository need not be the user's (the stop54 attacker review, finding 1): `fab fetch-checkpoints`
# places any regular file a host served, `.git/config` too, and git runs what that config says.

def staged_tree(base: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)
    return base


def test_a_host_s_git_repository_in_a_fetched_run_tree_is_never_entered(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A project whose .gitignore forgets the run records: git lists each fetched `.git` folder as an
    untracked repository. Its config's command never runs, its broken index fails nothing, and it counts
    for no bound, under `runs/` and under the `--runs-dir` in use alike."""
    root = tmp_path / "proj"
    (root / "conf").mkdir(parents=True)
    (root / "train.py").write_text("")
    (root / "conf" / "cluster.yaml").write_text("hosts:\n  gpu1: {address: 10.0.0.1}\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    mark = tmp_path / "MARK"
    served = {"notes/.git/HEAD": "ref: refs/heads/main\n",
              "notes/.git/config": f'[core]\n\tfsmonitor = "touch {mark}; echo"\n', "notes/.git/objects/info/keep": "",
              "notes/.git/refs/heads/keep": "", "notes/readme": "hi\n",
              "broken/.git/HEAD": "ref: refs/heads/main\n", "broken/.git/index": "garbage",
              "broken/.git/objects/k": "", "broken/.git/refs/k": ""}
    for runs in ("runs", "results"):
        landed = root / runs / "20261206-090000-beef" / "hosts" / "evil"
        place(staged_tree(tmp_path / f"staged-{runs}", served), landed, FetchReport("evil", landed), force=False)
        assert (landed / "notes/.git/config").is_file() and (landed / "broken/.git/index").is_file()
    monkeypatch.setattr(gitlist, "NESTED_MAX", 0)  # none of them is entered, so none is counted
    inventory = load_inventory(root / "conf" / "cluster.yaml")
    assert code_files(inventory, Project(root, root / "results")) == b"train.py\0"
    assert sync.project_files(root, (), (root / "results",)) == b"conf/cluster.yaml\0train.py\0"
    assert not mark.exists()


def test_a_nested_repository_s_own_config_runs_nothing(tmp_path: Path) -> None:
    """A clone outside the run records whose config names a command in `core.fsmonitor` and
    `core.hooksPath`: its files are listed, and the command never runs."""
    root = repository(tmp_path / "proj", {"train.py": ""})
    clone = repository(root / "vendored", {"mod.py": ""})
    mark = tmp_path / "MARK"
    (clone / "hooks").mkdir()
    (clone / "hooks" / "post-index-change").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (clone / "hooks" / "post-index-change").chmod(0o755)
    with (clone / ".git" / "config").open("a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {mark}; echo"\n\thooksPath = {clone / "hooks"}\n')
    assert listed(sync.project_files(root)) == ["train.py", "vendored/hooks/post-index-change", "vendored/mod.py"]
    assert not mark.exists()


def test_a_nested_repository_s_promisor_remote_is_never_fetched_from(tmp_path: Path) -> None:
    """git fetches the trees a sparse index lacks from a promisor remote, and a local remote's
    `uploadpack` is a shell command; the repository's own `protocol.file.allow=always` would beat a
    `-c protocol.allow=never`. The listing fetches nothing."""
    root = repository(tmp_path / "proj", {"train.py": ""})
    clone = repository(root / "vendored", {"a.py": "", "d/e/b.py": ""})
    try:
        git(clone, "sparse-checkout", "set", "--cone", "--sparse-index", "nothing")
    except subprocess.CalledProcessError:
        pytest.skip("this git has no sparse index")
    tree = subprocess.run(["git", "rev-parse", "HEAD:d"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout.strip()
    (clone / ".git" / "objects" / tree[:2] / tree[2:]).unlink()
    mark = tmp_path / "MARK"
    for key, value in (("core.repositoryformatversion", "1"), ("extensions.partialClone", "origin"),
                       ("remote.origin.url", str(tmp_path / "nowhere")), ("remote.origin.promisor", "true"),
                       ("remote.origin.uploadpack", f"touch {mark}; false"), ("protocol.file.allow", "always")):
        git(clone, "config", key, value)
    assert listed(sync.project_files(root)) == ["train.py", "vendored/a.py"]
    assert not mark.exists()


def test_a_nested_repository_s_core_worktree_cannot_make_it_list_another_folder(tmp_path: Path) -> None:
    """`core.worktree` naming another folder: git would list that folder's files (and judge this one's
    by its .gitignore). The nested git lists its own folder only."""
    root = repository(tmp_path / "proj", {"train.py": ""})
    clone = repository(root / "vendored", {"a.py": "", ".gitignore": "big.bin\n"})
    (clone / "big.bin").write_text("ignored here")
    (clone / "mine.py").write_text("")  # untracked, not ignored: shipped
    staged_tree(tmp_path / "other", {"big.bin": "", "secret.py": "", "sub/x.py": ""})
    git(clone, "config", "core.worktree", str(tmp_path / "other"))
    assert listed(sync.project_files(root)) == ["train.py", "vendored/.gitignore", "vendored/a.py",
                                                "vendored/mine.py"]


def index_naming(path: Path, names: list[bytes]) -> None:
    """A git index (version 2) listing `names` as empty files, whatever they are: git reads it unchecked."""
    body = b"DIRC" + struct.pack(">II", 2, len(names))
    for name in sorted(names):
        entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + bytes(20) + struct.pack(">H", len(name))
        entry += name
        body += entry + b"\0" * (8 - len(entry) % 8)
    path.write_bytes(body + hashlib.sha1(body).digest())


def test_names_a_nested_index_gives_that_leave_its_folder_are_dropped(tmp_path: Path) -> None:
    """A nested repository's index is whoever wrote the folder's: `../`, an absolute name or one through
    a link out of the folder would send a file of this machine (`..` and `/` named in full)."""
    root = repository(tmp_path / "proj", {"train.py": ""})
    (tmp_path / "secret.txt").write_text("this machine's")
    staged_tree(tmp_path / "elsewhere", {"x.py": ""})
    clone = root / "vendored"
    clone.mkdir()
    git(clone, "init", "-q")
    (clone / "ok.py").write_text("")
    (clone / "link").symlink_to(tmp_path / "elsewhere")
    index_naming(clone / ".git" / "index", [b"../../secret.txt", os.fsencode(tmp_path / "secret.txt"), b"link/x.py",
                                            b"ok.py"])
    assert listed(sync.project_files(root)) == ["train.py", "vendored/link", "vendored/ok.py"]


def test_folders_whose_files_all_stay_home_are_never_entered() -> None:
    """`kept_home`: judged before git runs in a folder, by `shippable`'s own rules, from the project's top
    and from that of each repository holding the folder."""
    folders = frozenset({"results", "wd"})
    home = ["runs/r1/hosts/h/notes", "Runs.bak/x", "results/r1/hosts/h/x", "RESULTS/x", "wd/vendored",
            "vendored/runs/x", "vendored/a/runs", "vendored/a/RUNS~/b"]
    kept = [n for n in home if kept_home(n, ("vendored", "vendored/a"), folders)]
    assert kept == home
    elsewhere = ["src/runs/x", "runsx/y", "vendored/x/runs", "results2/x", "vendored/results/x"]
    assert [n for n in elsewhere if kept_home(n, ("vendored",), folders)] == []


def test_the_nested_git_s_command_and_environment() -> None:
    assert gitlist.nested_argv() == [
        "git", "--no-pager", "--git-dir=.git", "--work-tree=.", "-c", "core.fsmonitor=", "-c",
        "core.hooksPath=/dev/null", "-c", "core.untrackedCache=false", "ls-files", "-z", "--cached", "--others",
        "--exclude-standard"]
    assert gitlist.nested_env({"HOME": "/h", "GIT_DIR": "/x/.git", "GIT_INDEX_FILE": "/x/i",
                               "GIT_ALLOW_PROTOCOL": "ext", "GIT_CONFIG_PARAMETERS": "'a.b'='c'"}) == {
        "HOME": "/h", "GIT_ALLOW_PROTOCOL": "-none-", "GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_PARAMETERS": "'a.b'='c'"}
