"""Two `fab fetch-checkpoints` of one run into one runs dir (the shared-hosts review, finding 8).

They shared the staging tree `runs/<id>/.incoming/`: one's clean-up removed files the other was
still hashing or placing, and it ended as "internal error: FileNotFoundError". Now a fetch holds
a lock in the run's folder for its whole length, and a second one is one line naming the first's
pid, touching nothing. The first fetch is stood in for by a real process holding the real lock
(no race to win: the second starts while the lock is held, whatever the timing); the fetches are
real, from a local host, with real rsync."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.layout import FETCH_LOCK
from meshrun.deploy.commands.fetch import main
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project

RUN = "20261201-100000-aaaa"
# The first fetch: holds the lock as fetch-checkpoints does, says so, and waits for stdin to close.
FIRST = """import sys
from pathlib import Path
from meshrun.deploy.edges.fetch import fetch_lock
with fetch_lock(Path(sys.argv[1]), sys.argv[2]):
    print("fetching", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "inventory").mkdir()
    inventory = tmp_path / "inventory" / "hosts.yaml"
    inventory.write_text("hosts:\n  box:\n    address: local\n    nproc: 1\n    workdir: hostwd\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(inventory), ("box",), time.time(), True, "box:29500").save(project.runs)
    host_run = tmp_path / "hostwd" / "runs" / RUN
    host_run.mkdir(parents=True)
    (host_run / "train.log").write_text("step 1\n")
    return project


def first_fetch(home: Path) -> subprocess.Popen[str]:
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(home), RUN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline() == "fetching\n"
    return first


def test_a_second_fetch_of_the_run_is_one_line_and_leaves_the_first_s_files_alone(project: Project) -> None:
    home = project.runs / RUN
    staged = home / ".incoming" / "box" / "tree" / "hosts" / "box" / "train.log"  # the first's, mid-placing
    staged.parent.mkdir(parents=True)
    staged.write_text("step 1\n")
    first = first_fetch(home)
    try:
        with pytest.raises(MeshrunError) as refused:
            main(RUN, None, False, project)
        assert str(refused.value) == (f"another fab fetch-checkpoints of run {RUN} is running (pid {first.pid}); "
                                      "wait for it to end, then fetch again if you need to")
        assert staged.read_text() == "step 1\n" and not (home / "hosts").exists()
        assert (home / FETCH_LOCK).read_text() == f"{first.pid}\n"  # the first's lock, as it wrote it
    finally:
        first.communicate(timeout=30)
    assert main(RUN, None, False, project) == 0  # the first is done: the next fetch runs
    assert (home / "hosts" / "box" / "train.log").read_text() == "step 1\n"
    assert main(RUN, None, False, project) == 0  # and its own lock went with it


def test_fetches_into_another_runs_dir_do_not_wait_for_each_other(project: Project, tmp_path: Path) -> None:
    first = first_fetch(project.runs / RUN)
    try:
        assert main(RUN, str(tmp_path / "elsewhere"), False, project) == 0
    finally:
        first.communicate(timeout=30)
    assert (tmp_path / "elsewhere" / RUN / "hosts" / "box" / "train.log").read_text() == "step 1\n"
