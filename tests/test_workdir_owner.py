"""One workdir, one project (the shared-hosts review, finding 1).

Every project's hosts default to the same `~/meshrun`: project B's sync replaced A's train.py while
A trained, and B's files, never deleted, shadowed A's modules after A synced again. Now the first
sync leaves an owner mark in the workdir and another project's sync there is refused in one line,
with nothing sent. The claim runs on the host inside the command rsync's ssh starts; here that
command runs through a stand-in ssh (`sh -c` on this machine), with real rsync and real git
projects. A local host's claim, the data sync's and codestat's reading of the mark are real too."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun.layout import SHIPPED_LIST, WORKDIR_OWNER
from meshrun.deploy.commands import sync as sync_cmd
from meshrun.deploy.edges import sync
from meshrun.deploy.edges.check_probes import PROBE_DIR
from meshrun.deploy.edges.sync import Claim, WorkdirTaken, project_claim, project_ids
from meshrun.deploy.edges.transport import CommandResult
from meshrun.deploy.errors import InputError
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer

ID_A, ID_B = "a" * 32, "b" * 32
CLAIM_B = Claim(ID_B, "projB", "/home/u/projB/inventory/hosts.yaml")


def git_project(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_refusal_names_the_host_the_workdir_the_other_project_and_what_to_do() -> None:
    assert sync.taken_message(("gpu2",), "~/meshrun", "projA", CLAIM_B) == (
        "host 'gpu2': workdir ~/meshrun holds the code of another project, projA; set `workdir: ~/meshrun-projB` "
        "for this project (projB) in /home/u/projB/inventory/hosts.yaml, or delete ~/meshrun/.meshrun-project "
        "there if projA no longer uses it")
    assert sync.taken_message(("gpu1", "gpu2"), "/scratch/wd/", None, CLAIM_B) == (
        "hosts 'gpu1', 'gpu2': workdir /scratch/wd/ holds another project's code (its .meshrun-project names no "
        "other); set `workdir: /scratch/wd-projB` for this project (projB) in /home/u/projB/inventory/hosts.yaml, "
        "or delete /scratch/wd/.meshrun-project there if no other project uses it")
    assert "another repository named projB (or of a checkout of this one synced before its first commit, " \
        "from a shallow clone or by an older meshrun); set `workdir: ~/meshrun-projB-bbbbbbbb`" in \
        sync.taken_message(("h",), "~", "projB", CLAIM_B)  # a clone shares the id: tests/test_project_identity.py


def test_a_mark_names_a_project_only_in_meshrun_s_form() -> None:
    assert sync.mark_name(f"{ID_A} projA".encode()) == "projA"
    for line in (b"", b"x", ID_A.encode(), f"{ID_A} \x1b[2Jevil".encode(), f"{ID_A} a b".encode(),
                 f"{ID_A} {'n' * 65}".encode(), b"\xff" * 50):
        assert sync.mark_name(line) is None, line
    said = f"host 'h': code sync failed (rsync exit 12): meshrun-workdir-owner: {ID_A} projA | rsync: connection"
    assert sync.SAID_RE.search(said).group(1) == "projA"  # type: ignore[union-attr]
    unnamed = sync.SAID_RE.search("... meshrun-workdir-owner: junk | rsync ...")
    assert unnamed is not None and unnamed.group(1) is None


def project_id(root: Path) -> str:
    return project_ids(root)[0]


def test_a_repository_with_no_commit_yet_has_a_random_id_kept_in_its_git_dir_and_survives_a_move(
        tmp_path: Path) -> None:
    """With no commit, nothing names the repository (with one: tests/test_project_identity.py)."""
    one = git_project(tmp_path / "one", {"a.py": ""})
    first = project_id(one)
    assert len(first) == 32 and project_id(one) == first
    assert project_id(git_project(tmp_path / "two", {"a.py": ""})) != first  # another repository
    (one / "sub").mkdir()
    assert project_id(one / "sub") not in (first, project_id(tmp_path / "two"))  # two projects of one repository
    moved = tmp_path / "moved"
    one.rename(moved)
    assert project_id(moved) == first
    assert project_claim(moved, tmp_path / "inv.yaml") == Claim(first, "moved", str(tmp_path / "inv.yaml"))
    odd = git_project(tmp_path / "my proj;$(x)", {})
    assert project_claim(odd, tmp_path / "i").name == "my_proj___x_"


def local_inventory(project: Path, workdir: str) -> Path:
    (project / "inventory").mkdir(exist_ok=True)
    path = project / "inventory" / "hosts.yaml"
    path.write_text(f"hosts:\n  box: {{address: local, workdir: '{workdir}'}}\n")
    return path


def sync_project(project: Path, workdir: str) -> dict[str, sync.SyncResult]:
    inventory = load_inventory(local_inventory(project, workdir), project)
    return sync_cmd.sync_code(inventory.hosts, inventory, Project(project, project / "runs"), Renderer())


def test_a_second_project_s_sync_into_a_local_workdir_is_refused_and_sends_nothing(tmp_path: Path) -> None:
    a = git_project(tmp_path / "projA", {"train.py": "print('A')\n", "helpers.py": "WHO = 'A'\n"})
    b = git_project(tmp_path / "projB", {"train.py": "print('B')\n", "helpers/__init__.py": "WHO = 'B'\n"})
    workdir = tmp_path / "hostwd"
    sync_project(a, str(workdir))
    before = sha(workdir / "train.py")
    assert (workdir / WORKDIR_OWNER).read_text() == f"{project_id(a)} projA\n"
    with pytest.raises(InputError) as refused:
        sync_project(b, str(workdir))
    assert str(refused.value) == (
        f"host 'box': workdir {workdir} holds the code of another project, projA; set `workdir: {workdir}-projB` "
        f"for this project (projB) in {b}/inventory/hosts.yaml, or delete {workdir}/.meshrun-project there if "
        "projA no longer uses it")
    assert sha(workdir / "train.py") == before and not (workdir / "helpers").exists()
    assert sync_project(a, str(workdir))["box"].files == 2  # the owner syncs as before
    sync_project(b, str(tmp_path / "hostwd-projB"))  # its own workdir, as the line says


def test_a_workdir_in_the_project_is_never_marked(tmp_path: Path) -> None:
    a = git_project(tmp_path / "projA", {"train.py": "", ".gitignore": "copy/\n"})
    assert sync_project(a, ".")["box"].skipped
    sync_project(a, "copy")
    assert not (a / WORKDIR_OWNER).exists() and not (a / "copy" / WORKDIR_OWNER).exists()
    assert (a / "copy" / "train.py").exists()


STAND_IN_SSH = """#!/bin/sh
# rsync's ssh: `HOST COMMAND...` run by sh here, as sshd runs it on the host.
shift
exec sh -c "$*"
"""


def remote_host(workdir: Path) -> Host:
    return Host("gpu2", "10.9.0.2", None, None, None, None, None, str(workdir), Network.LAN, None, None, None, ())


@pytest.fixture
def stand_in_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(0o755)
    monkeypatch.setattr(sync, "ssh_argv", lambda host, known_hosts: [str(ssh)])


def push(project: Path, workdir: Path, claim: Claim | None) -> sync.SyncResult:
    files = sync.project_files(project)
    return sync.sync_host(remote_host(workdir), project, None, files, lambda h, p: None, 60, claim=claim)


def test_the_claim_runs_in_rsync_s_own_command_on_the_host(tmp_path: Path, stand_in_ssh: None) -> None:
    a = git_project(tmp_path / "projA", {"train.py": "print('A')\n"})
    b = git_project(tmp_path / "projB", {"train.py": "print('B')\n", "extra.py": ""})
    workdir = tmp_path / "host" / "meshrun"
    claim_a = Claim(ID_A, "projA", "inv.yaml")
    push(a, workdir, claim_a)
    assert (workdir / WORKDIR_OWNER).read_text() == f"{ID_A} projA\n"
    assert sorted(os.listdir(workdir)) == [SHIPPED_LIST, WORKDIR_OWNER, "train.py"]  # nothing else left beside it
    with pytest.raises(WorkdirTaken) as refused:
        push(b, workdir, CLAIM_B)
    assert (refused.value.host, refused.value.other, refused.value.exit_code) == ("gpu2", "projA", 2)
    assert str(refused.value) == sync.taken_message(("gpu2",), str(workdir), "projA", CLAIM_B)
    assert (workdir / "train.py").read_text() == "print('A')\n" and not (workdir / "extra.py").exists()
    push(a, workdir, claim_a)  # the owner, again
    push(b, workdir, None)  # no claim (a caller of before): rsync as it was
    assert (workdir / "extra.py").exists()


def test_rsync_s_claim_takes_a_mark_of_this_checkout_s_earlier_id_and_rewrites_it(
        tmp_path: Path, stand_in_ssh: None) -> None:
    """A mark made before the project's first commit (or by an older meshrun): tests/test_project_identity.py."""
    b = git_project(tmp_path / "projB", {"train.py": "print('B')\n"})
    workdir = tmp_path / "host" / "meshrun"
    workdir.mkdir(parents=True)
    (workdir / WORKDIR_OWNER).write_text(f"{ID_A} projB\n")
    with pytest.raises(WorkdirTaken):
        push(b, workdir, CLAIM_B)
    push(b, workdir, Claim(ID_B, "projB", "i", also=("c" * 32, ID_A)))
    assert (workdir / WORKDIR_OWNER).read_text() == f"{ID_B} projB\n"
    assert sorted(os.listdir(workdir)) == [SHIPPED_LIST, WORKDIR_OWNER, "train.py"]


def test_a_hostile_mark_is_read_capped_never_run_and_shown_only_in_meshrun_s_form(
        tmp_path: Path, stand_in_ssh: None) -> None:
    b = git_project(tmp_path / "projB", {"train.py": ""})
    workdir = tmp_path / "wd"
    workdir.mkdir()
    canary = tmp_path / "ran"
    (workdir / WORKDIR_OWNER).write_bytes(b"$(touch " + str(canary).encode() + b")\x1b[2J `id`" + b"x" * 10_000)
    with pytest.raises(WorkdirTaken) as refused:
        push(b, workdir, CLAIM_B)
    assert refused.value.other is None and not canary.exists()
    assert str(refused.value) == sync.taken_message(("gpu2",), str(workdir), None, CLAIM_B)
    (workdir / WORKDIR_OWNER).unlink()
    os.mkfifo(workdir / WORKDIR_OWNER)  # not a file: no project's, and no hang reading it
    with pytest.raises(WorkdirTaken):
        push(b, workdir, CLAIM_B)
    with pytest.raises(WorkdirTaken):  # the same on this machine
        sync.sync_host(Host("box", "local", None, None, None, None, None, str(workdir), Network.LAN, None, None, None,
                            ()), b, None, sync.project_files(b), lambda h, p: None, 60, claim=CLAIM_B)


def test_a_rsync_argv_without_a_claim_is_the_one_of_before() -> None:
    host = Host("gpu2", "10.9.0.2", None, None, None, None, None, "~/meshrun", Network.LAN, None, None, None, ())
    plain = sync.rsync_argv(host, Path("/p"), None)
    assert plain[plain.index("--rsync-path") + 1] == "mkdir -p \"$HOME\"/meshrun && rsync"
    claimed = sync.rsync_argv(host, Path("/p"), None, claim=CLAIM_B)
    claim = ["sh", "-c", shlex.quote(sync.CLAIM_SH), "meshrun-claim", '"$HOME"/meshrun/.meshrun-project', ID_B,
             shlex.quote(f"{ID_B} projB")]
    assert claimed[claimed.index("--rsync-path") + 1] == f"mkdir -p \"$HOME\"/meshrun && {' '.join(claim)} && rsync"
    assert [a for a in claimed if a != claimed[claimed.index("--rsync-path") + 1]] == \
        [a for a in plain if a != plain[plain.index("--rsync-path") + 1]]


class WorkdirSession:
    """Runs the argv here in the workdir, as SSH runs it on the host (`cd WORKDIR && exec ...`)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def run(self, argv: Sequence[str], *, timeout: float = 60, create_workdir: bool = False) -> CommandResult:
        if create_workdir:
            self.workdir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(list(argv), cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr)


def test_the_data_sync_claims_over_its_session_before_sending(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    host = remote_host(workdir)
    sync.check_owner(host, WorkdirSession(workdir), tmp_path, Claim(ID_A, "projA", "i"))  # (`sync.check_owner`)
    assert (workdir / WORKDIR_OWNER).read_text() == f"{ID_A} projA\n"
    sync.check_owner(host, WorkdirSession(workdir), tmp_path, Claim(ID_A, "projA", "i"))
    with pytest.raises(WorkdirTaken) as refused:
        sync.check_owner(host, WorkdirSession(workdir), tmp_path, CLAIM_B)
    assert refused.value.other == "projA"
    assert (workdir / WORKDIR_OWNER).read_text() == f"{ID_A} projA\n"


def codestat_answer(workdir: Path, *args: str) -> str:
    source = (PROBE_DIR / "codestat.py").read_text()
    return subprocess.run([sys.executable, "-I", "-S", "-c", source, *args], cwd=workdir, input=b"a.py\0",
                          capture_output=True, check=True).stdout.decode().strip()


def test_a_host_asked_whether_it_holds_the_code_says_no_unless_the_mark_is_this_project_s(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    (tmp_path / SHIPPED_LIST).write_bytes(codestat.record_of([b"a.py"]))  # what the sync that sent a.py records
    digest = codestat.digest(os.fsencode(tmp_path), [b"a.py"])
    assert codestat_answer(tmp_path) == digest  # as before, without the claim's arguments
    assert codestat_answer(tmp_path, ID_A, WORKDIR_OWNER) == codestat.NOT_OURS  # no mark yet: synced, then marked
    (tmp_path / WORKDIR_OWNER).write_text(f"{ID_A} projA\n")
    assert codestat_answer(tmp_path, ID_A, WORKDIR_OWNER) == digest
    assert codestat_answer(tmp_path, ID_B, WORKDIR_OWNER) == codestat.NOT_OURS
