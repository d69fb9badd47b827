"""Code is not rewritten under a running run (deploy/commands/sync.py, deploy/commands/joincheck.py).

- `fab sync` replaced the files a running run executes from: its next elastic worker restart, its
  succession or a `--resume` imported the new code beside the old. `fab setup` already refused
  (`refuse_if_running`); `fab sync` now asks every host the same host-side test first (a run's agent
  holds its `agent.lock` in the workdir for its whole life) and refuses before any host's files change.
- `fab train` synced its code beside its connect and pre-flight, whatever ran there: a second train on
  the same hosts failed its pre-flight (the first run's port), after its sync had changed the first
  run's code. Every code sync now runs the same host-side test in the rsync's own command on a remote
  host (`syncbusy.busy_guard`: no round trip more), here on a local one, and sends nothing to a host
  that runs a run from its workdir (a host that holds this very code is asked, not synced: a second run
  on it goes on). Over real sshd: tests/test_train_under_run.py.
- `fab join` shipped this checkout's tree to the joiner while the members ran the launch's: two
  versions in one DDP job. A member is asked first whether its workdir holds this checkout's code.

A local host (`address: local`) with a real workdir and a real flock held on its agent lock, and real
rsync; the join's members are stood in for where they would need SSH."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from meshrun.layout import AGENT_LOCK, host_dir
from meshrun.deploy.commands import joincheck, membership
from meshrun.deploy.commands.membership import Request, RequestPoller, prepare_joiner
from meshrun.deploy.commands.sync import SyncUnderRun, runs_from, sync_code
from meshrun.deploy.edges.sync import busy_test_argv
from meshrun.deploy.run.syncbusy import BUSY_EXIT, busy_guard, busy_runs, guard_said, under_runs
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.host.setup import runs_error
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from tests.clirun import git_project, run_meshrun

RUN = "20261206-120000-abcd"


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def local_project(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose one host h1 is this machine, its workdir outside the project and holding the
    code of an earlier sync, from which run RUN runs."""
    root = git_project(tmp_path)
    (root / "train.py").write_text("print('new model')\n")
    (root / "inventory").mkdir()
    workdir = tmp_path / "wd"
    (root / "inventory" / "hosts.yaml").write_text(f"hosts:\n  h1: {{address: local, workdir: {workdir}}}\n")
    (workdir / host_dir(RUN, "h1")).mkdir(parents=True)
    (workdir / "train.py").write_text("print('old')\n")  # another size: rsync's quick check sees it
    RunRecord(RUN, "inventory/hosts.yaml", ("h1",), 1.0, True, "standalone", RUN).save(root / "runs")  # this one's run
    return root, workdir


@pytest.fixture
def held(local_project: tuple[Path, Path]) -> Iterator[Path]:
    """h1's agent of RUN holds its lock, as an agent does for its whole life (its pid written in it)."""
    lock = local_project[1] / host_dir(RUN, "h1") / AGENT_LOCK
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield lock


def sync(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_meshrun(root, "sync", env={"XDG_CACHE_HOME": str(tmp_path / "cache")})


def test_fab_sync_refuses_a_workdir_a_run_runs_from_and_changes_nothing(
        local_project: tuple[Path, Path], held: Path, tmp_path: Path) -> None:
    root, workdir = local_project
    before = tree(workdir)
    done = sync(root, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: run {RUN} is running from the workdir of h1: meshrun sync would change the code it runs from (a "
        "worker restart or a --resume would import the new code beside the old; nothing was synced); stop it first "
        f"(meshrun stop --run {RUN}) or wait for it to end"]
    assert tree(workdir) == before  # not a byte: no owner mark, no file list, the old model


def test_fab_sync_goes_on_once_the_run_ended(local_project: tuple[Path, Path], tmp_path: Path) -> None:
    """The lock file stays behind an ended run, let go: it is no run."""
    root, workdir = local_project
    (workdir / host_dir(RUN, "h1") / AGENT_LOCK).write_text("12345\n")
    done = sync(root, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / "train.py").read_text() == "print('new model')\n"


def test_every_code_sync_leaves_a_workdir_a_run_runs_from_alone(local_project: tuple[Path, Path], held: Path,
                                                                 tmp_path: Path) -> None:
    """`fab train`'s, `fab setup`'s and `fab join`'s code sync (sync_code), on this machine: refused before
    rsync, the run's record here lists h1, so its stop is advised."""
    root, workdir = local_project
    before = tree(workdir)
    inventory = load_inventory(root / "inventory" / "hosts.yaml", root)
    with pytest.raises(SyncUnderRun) as refused:
        sync_code(inventory.hosts, inventory, Project(root, root / "runs"), Renderer())
    assert str(refused.value) == (
        f"run {RUN} is running from the workdir of h1: the code sync would change the code it runs from (a worker "
        "restart or a --resume would import the new code beside the old; nothing was synced to that host); stop it "
        f"first (fab stop --run {RUN}) or wait for it to end")
    assert tree(workdir) == before


def guard(workdir: Path, python: str = sys.executable, seconds: int = 30) -> subprocess.CompletedProcess[str]:
    """The guard as a remote code sync's rsync runs it on the host (`(cd WORKDIR && GUARD)`), here."""
    shown = busy_guard(busy_test_argv(python), seconds)
    return subprocess.run(["sh", "-c", f"(cd {shlex.quote(str(workdir))} && {shown})"], capture_output=True,
                          text=True, timeout=60)


def test_the_remote_guard_ends_the_sync_under_a_run_and_says_which(local_project: tuple[Path, Path]) -> None:
    workdir = local_project[1]
    lock = workdir / host_dir(RUN, "h1") / AGENT_LOCK
    assert (done := guard(workdir)).returncode == 0 and done.stdout == ""  # a lock no agent holds: no run
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        done = guard(workdir)
        assert done.returncode == BUSY_EXIT and done.stdout == ""  # stdout is rsync's protocol: never written
        assert guard_said(done.stderr) == (RUN,)
        assert guard(workdir, str(workdir / "no-python")).returncode == 0  # not set up: none of its runs is there
    assert guard_said("rsync: connection unexpectedly closed") is None


def test_an_interpreter_that_floods_or_hangs_lets_the_sync_go_on(local_project: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    """A broken (or hostile) `python:` on the host: the guard reads GUARD_ANSWER_MAX bytes of its answer and
    waits `seconds` at most (rsync would give up on a host silent for 60 s). Under a held lock too: such an
    interpreter runs no run."""
    workdir = local_project[1]
    (tmp_path / "flood").write_text("#!/bin/sh\nexec yes\n")
    (tmp_path / "hang").write_text("#!/bin/sh\nexec sleep 600\n")
    for name in ("flood", "hang"):
        (tmp_path / name).chmod(0o755)
    with open(workdir / host_dir(RUN, "h1") / AGENT_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        # Each returns (`guard` gives up after 60 s: unbounded, the flood and the hang would not).
        assert guard(workdir, str(tmp_path / "flood")).returncode == 0
        assert guard(workdir, str(tmp_path / "hang"), seconds=1).returncode == 0
    assert guard_said("meshrun-workdir-busy: ../x is running from this workdir") == ()  # busy, no run named


def test_the_runs_a_busy_answer_names_are_read_in_the_host_sides_own_words() -> None:
    assert busy_runs(runs_error([(RUN, "h1", "42")])) == (RUN,)
    assert busy_runs(runs_error([(RUN, "h1", "42"), ("r2", "h1", "43"), (RUN, "h2", "44")])) == (RUN, "r2")
    many = [(f"r{n}", "h1", str(n)) for n in range(10)]
    assert busy_runs(runs_error(many)) == tuple(f"r{n}" for n in range(8))  # the host names 8, then "..."
    assert busy_runs("run ../x is running from this workdir") == ()  # no run id: not named
    assert busy_runs("another fab setup is still running") == ()


def test_the_refusal_names_each_run_and_its_hosts_once() -> None:
    assert under_runs({"h1": (RUN,), "h2": (RUN,)}).startswith(f"run {RUN} is running from the workdir of h1, h2: ")
    assert under_runs({"h1": (RUN, "r2"), "h2": ("r2",)}) == (
        f"runs {RUN} (on h1), r2 (on h1, h2) are running from these hosts' workdirs: fab sync would change the code "
        "they run from (a worker restart or a --resume would import the new code beside the old; nothing was "
        "synced); stop them first (fab stop --run ID, for each) or wait for them to end")


def test_a_run_no_record_here_puts_on_that_host_gets_no_stop_advice() -> None:
    """A compromised host answers busy with the id of a real run its honest peers train: `fab stop --run`
    on its word would end that run. Only a run whose record here lists the host is advised to be stopped."""
    ours = {(RUN, "h1")}
    assert under_runs({"h1": (RUN,)}, lambda run, host: (run, host) in ours).startswith(
        f"run {RUN} is running from the workdir of h1: ")
    told = under_runs({"h1": (RUN,), "evil": (RUN,)}, lambda run, host: (run, host) in ours)
    assert told == (f"a run this controller has no record of on that host is running from its workdir (evil says "
                    f"{RUN}): fab sync would change the code it runs from (a worker restart or a --resume would "
                    "import the new code beside the old; nothing was synced); stop it where it was started, or wait")
    assert "fab stop" not in told


def test_a_host_without_the_runs_interpreter_runs_none_of_them(local_project: tuple[Path, Path]) -> None:
    """Not set up yet: the interpreter the inventory's runs would use is not there."""
    root, workdir = local_project
    (root / "inventory" / "hosts.yaml").write_text(
        f"hosts:\n  h1: {{address: local, workdir: {workdir}, python: {workdir}/.venv/bin/python}}\n")
    host = load_inventory(root / "inventory" / "hosts.yaml", root).host("h1")
    assert runs_from(host, LocalSession(host, root)) == ()


# `fab join`: the joiner gets this checkout's code only when a member's workdir holds it.

MEMBERS = """\
hosts:
  h1: {address: 10.0.0.1}
  h2: {address: 10.0.0.2}
  h3: {address: 10.0.0.3}
"""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = git_project(tmp_path)
    (root / "model.py").write_text("WIDTH = 512\n")
    (root / "inv.yaml").write_text(MEMBERS)
    return Project(root, root / "runs")


def record(project: Project, detached: bool) -> RunRecord:
    run = RunRecord(RUN, str(project.root / "inv.yaml"), ("h1", "h2"), 1.0, detached, "10.0.0.1:29400", RUN, (1, 4),
                    controller_pid=None if detached else os.getpid())
    run.save(project.runs)
    return run


REFUSED = (f"run {RUN}: its member h1 does not hold this checkout's code (or did not answer the check): the checkout "
           "changed since the run was launched, and the joiner would run other code than the members; restore the "
           f"run's code (runs/{RUN}/provenance.json names its commit), or continue the run on this code: "
           f"fab stop --run {RUN}, then fab train --resume {RUN} --hosts h1,h2,h3")


def test_a_member_whose_workdir_holds_other_code_refuses_the_join(project: Project, tmp_path: Path) -> None:
    """A real member workdir (this machine) synced before the checkout changed: the host-side digest differs."""
    workdir = tmp_path / "member"
    workdir.mkdir()
    (workdir / "model.py").write_text("WIDTH = 256\n")
    (project.root / "member.yaml").write_text(f"hosts:\n  h1: {{address: local, workdir: {workdir}}}\n  h3: "
                                              "{address: 10.0.0.3}\n")
    inventory = load_inventory(project.root / "member.yaml", project.root)
    session = LocalSession(inventory.host("h1"), project.root)
    with pytest.raises(MeshrunError) as info:
        joincheck.require_run_code(record(project, True), inventory, project, {"h1": session}, "h3")
    assert str(info.value) == REFUSED


def test_a_member_holding_the_same_bytes_lets_the_join_go_on_whatever_its_times(project: Project,
                                                                                tmp_path: Path) -> None:
    """The review of this stop's commits: the quick digest (times, and the record of the last sync) refused a
    member holding this very code: a second clone, a file saved unchanged, a workdir synced by an older
    meshrun (no record), a `workdir: .` member. The join asks by content, and never the project itself."""
    workdir = tmp_path / "member"
    workdir.mkdir()
    (workdir / "model.py").write_text("WIDTH = 512\n")  # the same bytes, copied by hand: no record, other times
    (workdir / "inv.yaml").write_text(MEMBERS)  # shipped too: no inventory in use, nor under inventory/
    os.utime(workdir / "model.py", (1, 1))
    os.utime(project.root / "model.py")  # saved unchanged here
    (project.root / "member.yaml").write_text(f"hosts:\n  h0: {{address: local, workdir: .}}\n  h1: {{address: "
                                              f"10.0.0.1, workdir: {workdir}}}\n  h3: {{address: 10.0.0.3}}\n")
    inventory = load_inventory(project.root / "member.yaml", project.root)
    run = RunRecord(RUN, str(project.root / "member.yaml"), ("h0", "h1"), 1.0, True, "127.0.0.1:29400", RUN, (1, 4))
    # h1's commands run here, in its workdir (a stand-in for its SSH session: what is asked is the point)
    sessions = {h: LocalSession(inventory.host(h), project.root) for h in ("h0", "h1")}
    joincheck.require_run_code(run, inventory, project, sessions, "h3")  # h0 is the project: h1 is asked, holds it
    (workdir / "model.py").write_text("WIDTH = 256\n")
    with pytest.raises(MeshrunError, match="its member h1 does not hold this checkout's code"):
        joincheck.require_run_code(run, inventory, project, sessions, "h3")


class Stand:
    """What a join reaches stood in for: the member's answer (`holds`), and every later step recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, holds: bool) -> None:
        self.asked: list[object] = []
        self.later: list[str] = []

        def host_holds(session, python, files, digest, claim=None) -> bool:  # type: ignore[no-untyped-def]
            assert b"model.py" in files.split(b"\0")  # the list the joiner's sync sends
            self.asked.append(session)
            return holds

        def prepare(record, inventory, name, project, renderer, detach):  # type: ignore[no-untyped-def]
            self.later.append(f"prepare {name}")
            raise MeshrunError("prepared")

        def connect(host, known_hosts, root):  # type: ignore[no-untyped-def]
            self.later.append(f"connect {host.name}")
            raise MeshrunError("the joiner reached")

        monkeypatch.setattr(joincheck, "host_holds_content", host_holds)
        monkeypatch.setattr(membership, "connect", connect)
        self.prepare = prepare


def test_an_attached_join_asks_a_running_member_over_the_controllers_own_session(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    for holds, answer, later in ((False, REFUSED, []), (True, "prepared", ["prepare h3"])):
        stand = Stand(monkeypatch, holds)
        monkeypatch.setattr(membership, "prepare_joiner", stand.prepare)
        run = record(project, False)
        poller = RequestPoller(run, load_inventory(project.root / "inv.yaml", project.root), project, Renderer())
        member = SimpleNamespace(name="h1", session=object(), done=threading.Event())
        gone = SimpleNamespace(name="h2", session=object(), done=threading.Event())
        gone.done.set()  # lost: its session is not asked
        runner = SimpleNamespace(hosts=[gone, member], claim=lambda name: None, unclaim=lambda name: None)
        directory = membership.requests_dir(project, RUN)
        directory.mkdir(parents=True, exist_ok=True)
        request = Request("join", "h3", directory / f"1.000-abcd-join-h3-{holds}.json")
        poller._handle(runner, request)  # type: ignore[arg-type]
        done = json.loads(request.path.with_name(request.path.stem + ".done.json").read_text())
        assert done == {"ok": False, "message": answer}
        assert (stand.asked, stand.later) == ([member.session], later)


def test_a_detached_join_asks_a_member_before_the_joiner_is_touched(project: Project,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = load_inventory(project.root / "inv.yaml", project.root)
    reached: list[tuple[str, ...]] = []

    def open_sessions(hosts, inventory, root, timeout):  # type: ignore[no-untyped-def]
        reached.append(tuple(h.name for h in hosts))
        return {"h1": SimpleNamespace(close=lambda: None)}, {"h2": MeshrunError("host 'h2': timed out")}

    monkeypatch.setattr(joincheck, "open_sessions", open_sessions)
    for holds, answer, later in ((False, REFUSED, []), (True, "the joiner reached", ["connect h3"])):
        stand = Stand(monkeypatch, holds)
        with pytest.raises(MeshrunError) as info:
            prepare_joiner(record(project, True), inventory, "h3", project, Renderer(), True)
        assert (str(info.value), stand.later) == (answer, later)
    assert reached == [("h1", "h2"), ("h1", "h2")]


def test_a_detached_join_no_member_of_which_answers_starts_nothing(project: Project,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stand = Stand(monkeypatch, True)
    monkeypatch.setattr(joincheck, "open_sessions", lambda hosts, inventory, root, timeout: (
        {}, {h.name: MeshrunError(f"host '{h.name}': timed out") for h in hosts}))
    with pytest.raises(MeshrunError) as info:
        prepare_joiner(record(project, True), load_inventory(project.root / "inv.yaml", project.root), "h3", project,
                       Renderer(), True)
    assert str(info.value) == (f"run {RUN}: no member answered (host 'h1': timed out; host 'h2': timed out), so "
                               "whether they run this checkout's code is not known; nothing started, join again once "
                               "one answers")
    assert (stand.asked, stand.later) == ([], [])
