"""`fab join` keeps every joined host in the run record (deploy/commands/membership.py), on real files and
processes: a detached join of several hosts, several `fab join` processes at once, a controller's join
threads, and the atomic writer under them (common/fsutil.py). A lost host is one `fab stop|status|fetch`
never reaches again: its agent runs on as an orphan holding a GPU. And a detached join refuses a host
whose agent still runs the run. Only what needs an SSH host is stood in for (connect, sync, start)."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshrun import fsutil
from meshrun.deploy.commands import membership
from meshrun.deploy.commands.membership import Request, RequestPoller, add_member, join_or_leave, merged_hosts
from meshrun.deploy.edges.records import RunRecord, load_record
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.hoststate import HostState
from tests.memberproject import StoodIn, member_project

RUN = "20261205-120000-abcd"

@pytest.fixture
def project(tmp_path: Path) -> Project:
    return member_project(tmp_path, "h1", "h2", "h3", "h4")


def saved(project: Project, hosts: tuple[str, ...] = ("h1", "h2"), detached: bool = True) -> RunRecord:
    record = RunRecord(RUN, str(project.root / "inv.yaml"), hosts, 1.0, detached, "10.0.0.1:29400", RUN, (1, 4))
    record.save(project.runs)
    return record


def Starts(monkeypatch: pytest.MonkeyPatch, states: dict[str, str] | None = None) -> StoodIn:  # noqa: N802
    """`states`: what host_states answers of each host (the others: exited)."""
    given = states or {}
    return StoodIn(monkeypatch, lambda record: [HostState(record.run_id, h, given.get(h, "exited"), generation=0)
                                                for h in record.hosts])


def test_a_detached_join_of_two_hosts_records_both(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host's save started from the record read once: h3 was dropped when h4 was saved, so
    `fab stop` said "stopped" while h3's agent ran on."""
    starts = Starts(monkeypatch, {"h1": "running", "h2": "running"})  # a run that ended is refused (test_join_ended_run)
    record = saved(project)
    assert join_or_leave(project, record, "join", ["h3", "h4"], Renderer()) == [
        "started detached on h3", "started detached on h4"]
    assert starts.started == ["h3", "h4"]
    assert load_record(project.runs, RUN).hosts == ("h1", "h2", "h3", "h4")


def test_a_save_from_a_stale_record_keeps_the_hosts_saved_since(project: Project) -> None:
    stale = saved(project)
    add_member(project, stale, "h3")  # another `fab join` meanwhile
    assert add_member(project, stale, "h4").hosts == ("h1", "h2", "h3", "h4")
    assert load_record(project.runs, RUN).hosts == ("h1", "h2", "h3", "h4")
    assert add_member(project, stale, "h3").hosts == ("h1", "h2", "h3", "h4")  # already there: unchanged


def test_merged_hosts_keep_the_order_they_took_part_in() -> None:
    assert merged_hosts(("h1", "h3"), ("h1", "h2"), "h4") == ("h1", "h3", "h2", "h4")
    assert merged_hosts(("h1", "h2"), ("h1",), "h2") == ("h1", "h2")


def _join_from_stale(root: str, name: str, go: multiprocessing.synchronize.Event) -> None:
    project = Project(Path(root), Path(root) / "runs")
    stale = RunRecord(RUN, str(Path(root) / "inv.yaml"), ("h1", "h2"), 1.0, True, "10.0.0.1:29400", RUN, (1, 20))
    go.wait()
    add_member(project, stale, name)


def test_join_processes_at_once_lose_no_host(project: Project) -> None:
    """Several `fab join` processes, each holding the record it read before the others saved."""
    saved(project)
    context = multiprocessing.get_context("fork")
    go = context.Event()
    names = [f"j{i}" for i in range(8)]
    procs = [context.Process(target=_join_from_stale, args=(str(project.root), n, go)) for n in names]
    for proc in procs:
        proc.start()
    go.set()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    hosts = load_record(project.runs, RUN).hosts
    assert hosts[:2] == ("h1", "h2") and sorted(hosts[2:]) == names


def test_a_detached_join_refuses_a_host_still_running_the_run(project: Project,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached agent has no heartbeat: a host cut off for a while runs on. A second agent for it in
    the same rendezvous, on the same GPUs, ended the other's workers until the run died."""
    starts = Starts(monkeypatch, {"h1": "running", "h2": "running"})
    record = saved(project)
    with pytest.raises(MeshrunError) as info:
        join_or_leave(project, record, "join", ["h2"], Renderer())
    assert str(info.value) == (f"host 'h2' is still in run {RUN} (its agent is running); nothing started. "
                               f"To restart it there: fab leave --run {RUN} --hosts h2, then fab join")
    assert (starts.prepared, starts.started) == ([], [])
    assert load_record(project.runs, RUN) == record


def test_a_joiner_missing_from_the_record_is_asked_too(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """h3 joined once but an older meshrun lost it from the record: its agent still runs the run."""
    starts = Starts(monkeypatch, {"h1": "running", "h2": "running", "h3": "running"})
    record = saved(project)
    with pytest.raises(MeshrunError) as info:
        join_or_leave(project, record, "join", ["h3"], Renderer())
    assert str(info.value).startswith(f"host 'h3' is still in run {RUN} (its agent is running)")
    assert starts.asked == [("h1", "h2", "h3")] and starts.started == []


def test_a_detached_join_of_a_host_that_ended_starts_it(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = Starts(monkeypatch, {"h1": "running", "h2": "exited"})
    record = saved(project)
    assert join_or_leave(project, record, "join", ["h2"], Renderer()) == ["started detached on h2"]
    assert starts.started == ["h2"] and load_record(project.runs, RUN).hosts == ("h1", "h2")


class Runner:
    """The attached controller's JobRunner, as the join threads use it."""

    def __init__(self) -> None:
        self.added: list[str] = []

    def claim(self, name: str) -> None:
        return None

    def unclaim(self, name: str) -> None:
        pass

    def add_host(self, launch: SimpleNamespace, session: object) -> None:
        self.added.append(launch.name)


def answer_of(request: Request) -> dict:
    return json.loads(request.path.with_name(request.path.stem + ".done.json").read_text())


def test_a_controllers_join_threads_at_once_record_every_host(project: Project,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller answers each request in a thread of its own: two saving the record at once collided
    on one temp file, and the FileNotFoundError left `fab join` waiting 180 s for an answer."""
    Starts(monkeypatch)
    poller = RequestPoller(saved(project, detached=False), None, project, Renderer())  # type: ignore[arg-type]
    directory = membership.requests_dir(project, RUN)
    directory.mkdir(parents=True)
    requests = [Request("join", h, directory / f"1.000-ab{i}-join-{h}.json") for i, h in enumerate(("h3", "h4"))]
    runner = Runner()
    threads = [threading.Thread(target=poller._handle, args=(runner, r)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [answer_of(r)["ok"] for r in requests] == [True, True]
    assert load_record(project.runs, RUN).hosts == ("h1", "h2", *sorted(runner.added))
    assert sorted(poller.record.hosts) == ["h1", "h2", "h3", "h4"]


def test_a_join_whose_record_cannot_be_saved_is_still_answered(project: Project,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    Starts(monkeypatch)
    poller = RequestPoller(saved(project, detached=False), None, project, Renderer())  # type: ignore[arg-type]

    def full(*args: object) -> RunRecord:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(membership, "add_member", full)
    directory = membership.requests_dir(project, RUN)
    directory.mkdir(parents=True)
    request = Request("join", "h3", directory / "1.000-abcd-join-h3.json")
    poller._handle(Runner(), request)
    assert answer_of(request) == {"ok": False, "message": "host 'h3': join failed: [Errno 28] No space left on device"}


def test_threads_writing_one_file_at_once_each_write_it_whole(tmp_path: Path) -> None:
    """The temp file was named by pid only: two threads of one process shared it, and one's rename took
    the other's file away (FileNotFoundError), or wrote into it."""
    path = tmp_path / "launch.json"
    payloads = [json.dumps({"writer": i, "pad": "x" * (1000 + i)}).encode() for i in range(8)]
    errors: list[BaseException] = []
    go = threading.Barrier(len(payloads))

    def write(data: bytes) -> None:
        go.wait()
        try:
            for _ in range(60):
                fsutil.atomic_write_bytes(path, data)
        except BaseException as err:  # noqa: BLE001 - any failure is the finding
            errors.append(err)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert path.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]  # no temp file left behind


def test_written_files_keep_the_umask_mode_not_a_private_one(tmp_path: Path) -> None:
    """Records and checkpoints were 0o644 under the usual umask: a temp file made 0o600 would change that."""
    old = os.umask(0o022)
    try:
        fsutil.atomic_write_json(tmp_path / "a.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert json.loads((tmp_path / "a.json").read_text()) == {"a": 1}
