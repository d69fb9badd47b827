"""A project is its repository's (the stop50 review, finding 2).

The owner mark's id was a random one kept in each checkout's git dir, so a re-clone, a `git worktree`, a
CI checkout or the same repository on a second controller was "another project": refused on every host,
with advice that looped (`~/meshrun-proj-proj`). Now the id is the root of HEAD's first-parent chain
(with the project's folder in it), shared by every clone and kept by a merge of an unrelated history
(stop51 #3); the random id is kept only for a repository with no commit yet, and a mark that names it
(or an older meshrun's mark of this checkout) is still this project's, and is rewritten. Real git repositories, the real claim on this machine and the real claim
shell (`sh`), as the host runs it."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
from pathlib import Path

import pytest

from meshrun.layout import WORKDIR_OWNER
from meshrun.deploy.edges import sync
from meshrun.deploy.edges.sync import Claim, WorkdirTaken, project_claim, project_ids, root_commits
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host, Network

WHO = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *WHO, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def repository(path: Path, commits: int = 1) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for n in range(commits):
        (path / f"f{n}.py").write_text(f"{n}\n" if n else f"0\n# {path}\n")  # two repositories: two first commits
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"c{n}")
    return path


def clone(source: Path, path: Path, *options: str) -> Path:
    git(source.parent, "clone", "-q", *options, f"file://{source}", str(path))
    return path


def claimed_by_shell(workdir: Path, claim: Claim) -> subprocess.CompletedProcess[str]:
    """The claim as a host runs it (`claim_argv` over a session, from the workdir)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(sync.claim_argv(WORKDIR_OWNER, claim), cwd=workdir, capture_output=True, text=True)


def mark(workdir: Path) -> str:
    return (workdir / WORKDIR_OWNER).read_text()


def local_host(workdir: Path) -> Host:
    return Host("box", "local", None, None, None, None, None, str(workdir), Network.LAN, None, None, None, ())


def test_clones_a_worktree_and_a_shallow_clone_made_whole_share_the_id_another_repository_does_not(
        tmp_path: Path) -> None:
    a = repository(tmp_path / "a" / "proj", commits=2)
    first = project_ids(a)
    assert first[1:] == ((), False) and len(first[0]) == 32
    assert project_ids(clone(a, tmp_path / "b" / "proj")) == first  # a re-clone, or another machine's
    git(a, "worktree", "add", "-q", str(tmp_path / "wt"))
    assert project_ids(tmp_path / "wt") == first
    assert project_ids(repository(tmp_path / "c" / "proj"))[0] != first[0]  # another repository of that name
    (a / "sub").mkdir()
    (tmp_path / "b" / "proj" / "sub").mkdir()
    assert project_ids(a / "sub")[0] == project_ids(tmp_path / "b" / "proj" / "sub")[0] != first[0]
    assert not (a / ".git" / sync.PROJECT_ID_FILE).exists()  # nothing written into the repository any more


def test_a_clone_syncs_into_the_workdir_another_clone_marked(tmp_path: Path) -> None:
    a = repository(tmp_path / "a" / "proj")
    b = clone(a, tmp_path / "b" / "proj")
    (b / "f0.py").write_text("changed in b\n")
    workdir = tmp_path / "host" / "meshrun-proj"
    for project in (a, b, a):  # no ping-pong: each one is the owner
        claim = project_claim(project, project / "inventory" / "hosts.yaml")
        sync.sync_host(local_host(workdir), project, None, sync.project_files(project), lambda h, p: None, 60,
                       claim=claim)
        assert claimed_by_shell(workdir, claim).returncode == 0
        assert mark(workdir) == f"{project_ids(a)[0]} proj\n"
    assert (workdir / "f0.py").read_text() == (a / "f0.py").read_text()


def test_a_mark_made_before_the_first_commit_is_this_checkout_s_after_it_and_rewritten(tmp_path: Path) -> None:
    a = repository(tmp_path / "proj", commits=0)
    before = project_claim(a, tmp_path / "inv.yaml")
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    assert sync.claim_local(local, before) is None and claimed_by_shell(remote, before).returncode == 0
    assert mark(local) == mark(remote) == f"{before.project_id} proj\n"
    again = project_ids(a)
    (a / "x.py").write_text("")
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "first")
    after = project_claim(a, tmp_path / "inv.yaml")
    assert again[0] == before.project_id != after.project_id and after.also == (before.project_id,)
    other_clone = project_claim(clone(a, tmp_path / "b" / "proj"), tmp_path / "inv.yaml")
    assert other_clone.project_id == after.project_id and other_clone.also == ()
    assert sync.claim_local(local, other_clone) == f"{before.project_id} proj".encode()  # not that clone's id
    assert sync.claim_local(local, after) is None and claimed_by_shell(remote, after).returncode == 0
    assert mark(local) == mark(remote) == f"{after.project_id} proj\n"  # rewritten: now every clone's
    assert sync.claim_local(local, other_clone) is None and claimed_by_shell(remote, other_clone).returncode == 0
    assert sorted(p.name for p in remote.iterdir()) == [WORKDIR_OWNER]  # nothing left aside


def old_meshrun_id(project: Path) -> str:
    """The id meshrun gave before: a random id kept in the git dir, hashed with the project's folder."""
    kept = secrets.token_hex(16)
    (project / ".git" / sync.PROJECT_ID_FILE).write_text(kept + "\n")
    return hashlib.sha256(f"{kept}\0".encode()).hexdigest()[:32]


def test_an_older_meshrun_s_mark_is_accepted_from_this_checkout_only(tmp_path: Path) -> None:
    a = repository(tmp_path / "a" / "proj")
    b = clone(a, tmp_path / "b" / "proj")
    old_a, old_b = old_meshrun_id(a), old_meshrun_id(b)
    claim_a, claim_b = project_claim(a, tmp_path / "i"), project_claim(b, tmp_path / "i")
    assert claim_a.also == (old_a,) and claim_b.also == (old_b,) and claim_a.project_id == claim_b.project_id
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (workdir / WORKDIR_OWNER).write_text(f"{old_a} proj\n")
    refused = claimed_by_shell(workdir, claim_b)  # b cannot tell a's old random id from another repository's
    assert (refused.returncode, refused.stderr) == (sync.OWNER_EXIT, f"{sync.OWNER_SAID} {old_a} proj\n")
    with pytest.raises(WorkdirTaken) as taken:
        sync.check_owner(local_host(workdir), None, b, claim_b)  # type: ignore[arg-type]
    assert taken.value.other == "proj"
    assert claimed_by_shell(workdir, claim_a).returncode == 0 and mark(workdir) == f"{claim_a.mark}\n"
    assert claimed_by_shell(workdir, claim_b).returncode == 0  # a's next sync made it the repository's


def test_a_shallow_clone_has_its_own_id_says_why_and_joins_once_made_whole(tmp_path: Path) -> None:
    a = repository(tmp_path / "a" / "proj", commits=3)
    ci = clone(a, tmp_path / "ci" / "proj", "--depth", "1")
    shallow = project_claim(ci, tmp_path / "inv.yaml")
    assert shallow.shallow and shallow.project_id != project_ids(a)[0]
    assert sync.taken_message(("gpu1",), "~/meshrun-proj", "proj", shallow) == (
        "host 'gpu1': workdir ~/meshrun-proj holds the code of another repository named proj (or of a checkout of "
        "this one synced before its first commit, from a shallow clone or by an older meshrun); delete "
        "~/meshrun-proj/.meshrun-project there if that proj no longer uses it or is a checkout of this repository; "
        "this checkout is a shallow clone, which cannot name its repository: `git fetch --unshallow` here, then "
        "sync again")  # no workdir named by an id that the next CI checkout will not have
    git(ci, "fetch", "-q", "--unshallow")
    assert project_ids(ci) == (project_ids(a)[0], (shallow.project_id,), False)


def merge_unrelated(a: Path, other_at: Path) -> None:
    """`git pull --allow-unrelated-histories` of a hosted repository made with a README."""
    other = repository(other_at, commits=0)
    (other / "README.md").write_text("")
    git(other, "add", "-A")
    git(other, "commit", "-q", "-m", "Initial commit")
    git(a, "fetch", "-q", str(other), "main")
    git(a, "merge", "-q", "--allow-unrelated-histories", "-m", "m", "FETCH_HEAD")


def test_a_merge_of_an_unrelated_history_keeps_the_id_and_accepts_the_all_roots_mark(tmp_path: Path) -> None:
    a = repository(tmp_path / "a" / "proj", commits=2)
    before, first = project_claim(a, tmp_path / "inv.yaml"), root_commits(a)
    merge_unrelated(a, tmp_path / "other")
    after = project_claim(a, tmp_path / "inv.yaml")
    every = root_commits(a, every=True)
    assert every is not None and len(every) == 2 and list(every) == sorted(every)
    assert first is not None and len(first) == 1 and root_commits(a) == first and first[0] in every
    all_roots = hashlib.sha256(f"roots {' '.join(every)}\0".encode()).hexdigest()[:32]  # the id meshrun gave
    assert (after.project_id, after.also) == (before.project_id, (all_roots,)) and before.also == ()
    assert project_ids(clone(a, tmp_path / "b" / "proj")) == project_ids(a)  # a clone still shares it
    git(a, "checkout", "-q", "HEAD~1")  # a commit from before the merge: the same project, not another
    assert project_ids(a)[0] == before.project_id
    git(a, "checkout", "-q", "main")
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    for workdir in (local, remote):  # marked after the merge by the meshrun that hashed every root
        (workdir / WORKDIR_OWNER).write_text(f"{all_roots} proj\n")
    assert sync.claim_local(local, after) is None and claimed_by_shell(remote, after).returncode == 0
    assert mark(local) == mark(remote) == f"{after.mark}\n"  # rewritten to the id that lasts
    assert root_commits(repository(tmp_path / "empty", commits=0)) is None


def test_the_git_calls_are_argv_bounded_and_a_slow_one_is_one_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    odd = repository(tmp_path / "p;$(touch canary)'x")
    assert len(project_ids(odd)[0]) == 32 and not (tmp_path / "canary").exists()
    calls: list[tuple[object, dict[str, object]]] = []
    real = subprocess.run

    def slow_rev_list(argv: object, **kwargs: object) -> object:
        calls.append((argv, kwargs))
        if isinstance(argv, list) and "rev-list" in argv:
            raise subprocess.TimeoutExpired(argv, 120)
        return real(argv, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(sync.subprocess, "run", slow_rev_list)
    with pytest.raises(MeshrunError) as slow:
        project_ids(odd)
    assert str(slow.value) == (f"{odd}: git took over 120 s to find the repository's first commit (meshrun's "
                               "project id); run `git commit-graph write --reachable` there")
    assert [argv[:2] for argv, _ in calls] == [["git", "rev-parse"], ["git", "rev-list"]]  # type: ignore[index]
    assert all(kw["timeout"] == sync.GIT_TIMEOUT_S and "shell" not in kw and kw["cwd"] == odd for _, kw in calls)


CLAIM = Claim("1a2b3c4d" + "0" * 24, "proj", "/home/u/proj/inventory/hosts.yaml")


def test_the_refusal_never_suggests_a_workdir_that_ends_in_the_name_twice() -> None:
    assert sync.taken_message(("gpu1", "gpu2"), "~/meshrun-proj", "proj", CLAIM) == (
        "hosts 'gpu1', 'gpu2': workdir ~/meshrun-proj holds the code of another repository named proj (or of a "
        "checkout of this one synced before its first commit, from a shallow clone or by an older meshrun); set "
        "`workdir: ~/meshrun-proj-1a2b3c4d` for this project (proj) in /home/u/proj/inventory/hosts.yaml, or "
        "delete ~/meshrun-proj/.meshrun-project there if that proj no longer uses it or is a checkout of this "
        "repository")
    assert sync.taken_message(("gpu1",), "~/meshrun-proj/", "other", CLAIM) == (
        "host 'gpu1': workdir ~/meshrun-proj/ holds the code of another project, other; set "
        "`workdir: ~/meshrun-proj-1a2b3c4d` for this project (proj) in /home/u/proj/inventory/hosts.yaml, or "
        "delete ~/meshrun-proj/.meshrun-project there if other no longer uses it")
    assert sync.taken_message(("gpu1",), "~/meshrun-proj-1a2b3c4d", "proj", CLAIM) == (
        "host 'gpu1': workdir ~/meshrun-proj-1a2b3c4d holds the code of another repository named proj (or of a "
        "checkout of this one synced before its first commit, from a shallow clone or by an older meshrun); "
        "delete ~/meshrun-proj-1a2b3c4d/.meshrun-project there if that proj no longer uses it or is a checkout "
        "of this repository")  # an inventory both share: no workdir both would be told
    suggested = {(w, o): sync.new_workdir(w, o, CLAIM) for w in ("~", "~/meshrun", "~/meshrun-proj", "/s/wd-proj/")
                 for o in ("proj", "other", None)}
    assert {k: s for k, s in suggested.items() if s is None or s.endswith("-proj-proj") or
            s.rstrip("/") == k[0].rstrip("/")} == {}
    assert sync.new_workdir("~", "other", CLAIM) == "~/meshrun-proj"  # as before, for another project
