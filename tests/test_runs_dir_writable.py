"""A runs folder this controller cannot record runs in is refused before any host (bad-input finding 4).

`--runs-dir notes.txt/runs` (under a file), `/proc/x` (a place that takes no new folder) or a folder that
takes no file passed `find_project`; the first record, written after every host was connected, synced and
pre-flighted, then ended the run in "internal error: NotADirectoryError", exit status 1. Now the tasks that
record runs (train, join, leave, fetch-checkpoints without --dest) refuse it in one line, exit status 2;
the tasks that only read runs (status, logs, report) create nothing, and refuse only a folder that can
never exist, instead of suggesting a `meshrun train --runs-dir` that would fail the same way.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import shown_path, with_path
from meshrun.deploy.project import Project, find_project
from tests.clirun import git_project, run_meshrun

FIX = "name a directory this controller can write run records in"
needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on: a host there refuses every connection."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = git_project(tmp_path).resolve()
    (root / "inventory").mkdir()
    (root / "notes.txt").write_text("a file, not a folder\n")
    key = tmp_path / "id_ed25519"  # a key to offer: without one, a train stops before it dials
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    gpu1 = f"{{address: 127.0.0.1, port: {closed_port()}, user: nobody, identity: {key}}}"
    (root / "inventory" / "hosts.yaml").write_text(f"hosts:\n  gpu1: {gpu1}\nknown_hosts: known_hosts\n")
    (root / "inventory" / "known_hosts").write_text("")
    return root


def refusal(root: Path, runs: str, writes: bool) -> str:
    with pytest.raises(InputError) as info:
        find_project(None, runs, root, writes=writes)
    return str(info.value)


def test_a_runs_folder_under_a_file_is_refused_by_every_task(repo: Path) -> None:
    expected = under_a_file(repo, "notes.txt/runs")
    assert refusal(repo, "notes.txt/runs", writes=True) == expected
    assert refusal(repo, "notes.txt/runs", writes=False) == expected  # status would suggest a failing train
    assert refusal(repo, "notes.txt/a/b", writes=False) == under_a_file(repo, "notes.txt/a/b")
    assert refusal(repo, "notes.txt", writes=False) == with_path("--runs-dir ", repo / "notes.txt",
                                                                 f": exists and is not a directory; {FIX}")


def under_a_file(repo: Path, runs: str) -> str:
    """The refusal of `runs` under the file notes.txt: a long temporary path is shortened in its middle."""
    return with_path("--runs-dir ", repo / runs, f": {shown_path(repo / 'notes.txt')} is not a directory, so "
                                                 f"nothing can be made under it; {FIX}")


def test_the_default_runs_folder_is_named_with_the_flag_that_moves_it(repo: Path) -> None:
    (repo / "runs").write_text("")
    with pytest.raises(InputError) as info:
        find_project(None, None, repo, writes=True)
    assert str(info.value) == with_path("runs folder ", repo / "runs", ": exists and is not a directory; pass "
                                        "--runs-dir DIR, a directory this controller can write run records in")


@needs_proc
def test_a_folder_that_cannot_be_made_or_written_in_is_refused_by_the_tasks_that_record(repo: Path) -> None:
    assert refusal(repo, "/proc/x", writes=True) == (f"--runs-dir /proc/x: cannot create it (no such file or "
                                                     f"directory); {FIX}")
    assert find_project(None, "/proc/x", repo) == Project(repo, Path("/proc/x"))  # reading: no runs there, said later
    mine = Path("/proc/self").resolve()  # a folder, and root too may create nothing in it
    assert refusal(repo, "/proc/self", writes=True) == (f"--runs-dir {mine}: cannot write in it (no such file or "
                                                         f"directory); {FIX}")


def test_reading_creates_nothing_and_recording_leaves_only_the_folder(repo: Path) -> None:
    assert find_project(None, None, repo) == Project(repo, repo / "runs")
    assert find_project(None, "records/lab", repo) == Project(repo, repo / "records/lab")
    assert not (repo / "runs").exists() and not (repo / "records").exists()
    assert find_project(None, "records/lab", repo, writes=True) == Project(repo, repo / "records/lab")
    assert find_project(None, None, repo, writes=True) == Project(repo, repo / "runs")
    assert list((repo / "records/lab").iterdir()) == [] and list((repo / "runs").iterdir()) == []  # no check file left


def meshrun(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`meshrun` with HOME and XDG_CACHE_HOME beside the project: none of the user's own."""
    return run_meshrun(root, *args, env={"HOME": str(root.parent), "XDG_CACHE_HOME": str(root.parent / "cache")})


@needs_proc
def test_the_real_tasks_refuse_before_any_host_and_status_suggests_no_failing_train(repo: Path) -> None:
    """gpu1's port refuses connections: a task that reached a host would say `cannot connect`, exit status 1."""
    under_file = f"error: {under_a_file(repo, 'notes.txt/runs')}\n"
    cannot = f"error: --runs-dir /proc/x: cannot create it (no such file or directory); {FIX}\n"
    for args, stderr in [
        (("train", "--runs-dir", "notes.txt/runs", "--skip-checks", "--", "epochs=1"), under_file),
        (("train", "--runs-dir", "/proc/x", "--skip-checks", "--no-sync", "--", "epochs=1"), cannot),
        (("fetch-checkpoints", "--runs-dir", "/proc/x"), cannot),
        (("join", "--run", "20261206-150012-9b64", "--hosts", "gpu1", "--runs-dir", "/proc/x"), cannot),
        (("leave", "--run", "20261206-150012-9b64", "--hosts", "gpu1", "--runs-dir", "/proc/x"), cannot),
        (("status", "--runs-dir", "notes.txt/runs"), under_file),
    ]:
        done = meshrun(repo, *args)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", stderr), args
    assert meshrun(repo, "status").returncode == 0
    assert not (repo / "runs").exists()  # reading made no runs folder


def test_control_a_writable_runs_folder_goes_on_to_the_host(repo: Path) -> None:
    """The other side, so the refusals above cannot pass by never reaching a host: the same command with a
    folder it can make gets as far as gpu1, whose port refuses (exit status 1)."""
    done = meshrun(repo, "train", "--runs-dir", "records", "--skip-checks", "--no-sync", "--", "epochs=1")
    assert done.returncode == 1 and "gpu1" in done.stderr, done.stderr[-500:]
    assert (repo / "records").is_dir()
