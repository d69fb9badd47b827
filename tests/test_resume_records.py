"""`fab train --resume` and the records of the attempt before it (a review, defects 4 and 5).

A resumed run reuses its folder. It used to keep the last attempt's summary.json for the whole new
attempt (so `fab status|logs|stop` took the run for ended, and scripts polling summary.json read the
old outcome at once), to read the last attempt's result.json on the hosts as this one's, and to
rewrite launch.json with the resume's hosts only (the hosts it left out, with the first attempt's
files, could no longer be reached). Its checkpoint push listed the controller's best.pt for a host
that kept its own older one, and wrote that manifest, like commplan.json, in a way a cut could
truncate. Real files and processes throughout: the controller's steps on a real runs dir, real rsync
to a local host, the real agent, the real remote write under a file-size limit."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.checkpointpush import push_checkpoints
from meshrun.deploy.edges.check_probes import WRITE_FILE
from meshrun.deploy.edges import records
from meshrun.deploy.edges.records import (RunRecord, live_records, load_record, may_be_running, record_from,
                                          retire_attempt)
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.manifest import ManifestEntry, Manifest, manifest_text, parse_manifest
from meshrun.deploy.run.plan import Workload, plan_launch
from meshrun.deploy.run.resume import ResumedHosts, pushed_manifest, resumed_hosts
from meshrun.deploy.errors import MeshrunError
from meshrun.layout import COMM_PLAN, LAUNCH_RECORD, PROVENANCE, SUMMARY

REPO = Path(__file__).resolve().parents[1]
RUN = "20260101-000000-abcd"
FOUR = "".join(f"  h{i}: {{address: 192.0.2.{i}, nproc: 1}}\n" for i in range(1, 5))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def finished(tmp_path: Path) -> Project:
    """A project whose run RUN ended attached on h1, h2, h3 an hour ago: its record, summary,
    provenance and --comm floors, and its controller long gone."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + FOUR)
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1", "h2", "h3"), time.time() - 3600, False, "192.0.2.1:29400",
              elastic=(2, 3), controller_pid=None).save(project.runs)
    home = project.run_home(RUN)
    for name, body in ((SUMMARY, '{"status": "failed", "epochs_completed": 3}\n'), (PROVENANCE, '{"git": "old"}\n'),
                       (COMM_PLAN, '{"hook": "powersgd"}\n')):
        (home / name).write_text(body)
    return project


def resume_on(project: Project, hosts: str | None, inventory: str | None = None) -> RunRecord:
    """The controller's steps of `fab train --resume RUN [--hosts HOSTS]` up to the launch, with no
    host to contact: defaults, plan, the resume's preparing (no checkpoints fetched: nothing to push)
    and the record."""
    renderer = Renderer()
    request = train_cmd._with_resumed_defaults(train_cmd.TrainRequest(inventory, hosts, Workload(), nnodes="2:3",
                                                                      resume=RUN), project, renderer)
    inv = load_inventory(Path(request.inventory), project.root)
    selection = select_hosts(inv, request.hosts)
    options = train_cmd._launch_options(request, inv, len(selection.hosts), renderer)
    options = train_cmd._prepare_hosts(request, selection, inv, {}, options, project, renderer, None)
    plan = plan_launch(selection, options, {}, sys.executable)
    return train_cmd._record(request, inv, selection.hosts, plan, options, project, renderer)


def test_a_resume_retires_the_last_attempts_end_records_and_counts_as_running(finished: Project) -> None:
    home = finished.run_home(RUN)
    before = {name: (home / name).read_text() for name in (SUMMARY, PROVENANCE, COMM_PLAN)}
    assert live_records(finished.runs) == []  # ended: it has a summary
    record = resume_on(finished, "h2,h3")
    assert not (home / SUMMARY).exists() and not (home / PROVENANCE).exists() and not (home / COMM_PLAN).exists()
    assert {name: (home / name.replace(".json", ".prev.json")).read_text() for name in before} == before
    assert may_be_running(record, (home / SUMMARY).exists(), False, time.time()) is True
    assert [r.run_id for r in live_records(finished.runs)] == [RUN]


def test_a_resume_that_fails_before_its_launch_leaves_the_last_attempts_records(
        finished: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint push failed (a host cut off, say): nothing of this attempt started, so the
    run keeps its summary and stays ended; retired first, it would count as running for ever."""
    def cut(*_: object, **__: object) -> None:
        raise MeshrunError("host 'h2': could not push checkpoints: cut")

    monkeypatch.setattr(train_cmd, "push_checkpoints", cut)
    home = finished.run_home(RUN)
    with pytest.raises(MeshrunError):
        resume_on(finished, "h2,h3")
    assert (home / SUMMARY).exists() and not (home / "summary.prev.json").exists()
    assert live_records(finished.runs) == []


def test_the_record_lists_every_attempts_hosts_and_the_next_resume_defaults_to_the_latest(
        finished: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """h1 and h3 left out, h4 added: this attempt's hosts first, in launch order (a joiner walks the
    succession in the record's order), then h1 and h3; the next resume starts on h2, h4 again. Each
    attempt's controller is this test's process, ended by the time of the next (a pytest whose
    command line names `fab` and `train` files would read as a live `fab train`)."""
    monkeypatch.setattr(records, "controller_alive", lambda record: False)
    record = resume_on(finished, "h2,h4")
    assert (record.hosts, record.earlier, record.members) == (("h2", "h4", "h1", "h3"), ("h1", "h3"), ("h2", "h4"))
    saved = load_record(finished.runs, RUN)
    assert (saved.hosts, saved.earlier, saved.members, saved.started) == (record.hosts, record.earlier, record.members,
                                                                          record.started)
    again = resume_on(finished, None)  # `fab train --resume RUN`: the latest attempt's hosts
    assert (again.hosts, again.earlier, again.members) == (("h2", "h4", "h1", "h3"), ("h1", "h3"), ("h2", "h4"))
    back = resume_on(finished, "h1,h2,h4")
    assert (back.hosts, back.earlier) == (("h1", "h2", "h4", "h3"), ("h3",))


def test_a_resume_with_an_inventory_without_an_earlier_host_drops_it(finished: Project, capsys) -> None:
    """The record names one inventory; a host it lacks could never be reached through it (every
    later status, stop and fetch would name it as a host they cannot reach)."""
    (finished.root / "three.yaml").write_text("hosts:\n" + FOUR.replace("  h1: {address: 192.0.2.1, nproc: 1}\n", ""))
    record = resume_on(finished, "h2,h3", str(finished.root / "three.yaml"))
    assert (record.hosts, record.earlier) == (("h2", "h3"), ())
    shown = capsys.readouterr()
    assert "resume: h1, of an earlier attempt, not in " in shown.out + shown.err


def test_resumed_hosts_and_with_member_are_exact() -> None:
    assert resumed_hosts(("h1", "h2", "h3"), ("h3", "h2"), {"h1", "h2", "h3"}) == ResumedHosts(
        ("h3", "h2", "h1"), ("h1",), ())
    assert resumed_hosts(("h1", "h2", "h3"), ("h4",), {"h1", "h3", "h4"}) == ResumedHosts(
        ("h4", "h1", "h3"), ("h1", "h3"), ("h2",))
    record = RunRecord(RUN, "/inv.yaml", ("h2", "h4", "h1"), 0.0, True, "192.0.2.2:29400", earlier=("h1",))
    assert record.with_member("h1").hosts == ("h2", "h4", "h1") and record.with_member("h1").earlier == ()
    assert record.with_member("h5").hosts == ("h2", "h4", "h1", "h5") and record.with_member("h5").earlier == ("h1",)


@pytest.mark.parametrize(("earlier", "ok"), [([], True), (["h1"], True), (["h9"], False), (["h1", "h2"], False),
                                             ("h1", False), ([1], False)])
def test_the_records_earlier_hosts_are_checked(earlier: object, ok: bool) -> None:
    data = {"run_id": RUN, "inventory": "/inv.yaml", "hosts": ["h1", "h2"], "started": 0.0, "detached": True,
            "rdzv_endpoint": "192.0.2.1:29400", "earlier": earlier}
    if ok:
        assert record_from(data, RUN, Path(LAUNCH_RECORD)).earlier == tuple(earlier)  # type: ignore[arg-type]
    else:
        with pytest.raises(InputError, match="earlier is not a list of some of its hosts"):
            record_from(data, RUN, Path(LAUNCH_RECORD))
    del data["earlier"]  # a record of an older meshrun
    assert record_from(data, RUN, Path(LAUNCH_RECORD)).earlier == ()


def test_retiring_twice_keeps_the_newest_previous_and_needs_no_files(tmp_path: Path) -> None:
    assert retire_attempt(tmp_path) == ()
    (tmp_path / SUMMARY).write_text("first")
    assert retire_attempt(tmp_path) == (SUMMARY,)
    (tmp_path / SUMMARY).write_text("second")
    assert retire_attempt(tmp_path) == (SUMMARY,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.prev.json"]
    assert (tmp_path / "summary.prev.json").read_text() == "second"


def test_the_agent_removes_the_last_attempts_result_as_it_starts(tmp_path: Path) -> None:
    """rank 0's result.json of the attempt before must be gone before this attempt's command runs:
    read_result reads it whatever this attempt's outcome. The built-in trainer's run only (a script's
    result.json is its own: tests/test_script_result_kept.py); the agent tells them apart by the
    `-m meshrun.train` in its command (agentargs.runs_trainer), here words `python -c` passes on unread."""
    result = tmp_path / "runs" / RUN / "result.json"
    result.parent.mkdir(parents=True)
    result.write_text('{"epochs_completed": 3}')
    check = f"import os, sys; sys.exit(3 if os.path.exists({str(result)!r}) else 0)"
    done = subprocess.run([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", RUN, "--host", "h1",
                           "--heartbeat-timeout", "0", "--quiet", "--", sys.executable, "-c", check, "-m", "meshrun.train"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done
    assert not result.exists()
    assert json.loads((tmp_path / "runs" / RUN / "hosts" / "h1" / "exit.json").read_text())["rc"] == 0


def manifest(**digests: str) -> Manifest:
    return Manifest(tuple(ManifestEntry(name, digest) for name, digest in digests.items()), ())


def test_the_pushed_manifest_keeps_the_hosts_line_for_a_file_it_kept() -> None:
    ours = manifest(**{"ckpt-step000000010.pt": "a" * 64, "ckpt-step000000020.pt": "b" * 64, "best.pt": "c" * 64})
    theirs = manifest(**{"ckpt-step000000010.pt": "a" * 64, "best.pt": "d" * 64})
    assert pushed_manifest(ours, theirs, {"ckpt-step000000020.pt", "MANIFEST.sha256"}) == (
        f"{'a' * 64}  ckpt-step000000010.pt\n{'d' * 64}  best.pt\n{'b' * 64}  ckpt-step000000020.pt\n")
    # A host without best.pt gets ours; a file it holds but does not list gets no line.
    assert pushed_manifest(ours, manifest(), {"best.pt", "ckpt-step000000020.pt"}) == (
        f"{'b' * 64}  ckpt-step000000020.pt\n{'c' * 64}  best.pt\n")


def _checkpoints(directory: Path, files: dict[str, bytes], listed: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "MANIFEST.sha256").write_text(manifest_text({n: sha(files[n]) for n in listed}))


def test_the_resume_push_leaves_the_host_a_manifest_its_files_match(tmp_path: Path) -> None:
    """The rendezvous host trained to step 10 and holds its own best.pt; the controller fetched up
    to step 20 from another host, with a newer best.pt. rsync never replaces the host's best.pt, so
    the manifest it gets must list the host's own: every listed file matches its hash."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: local, workdir: w1, nproc: 1}\n")
    project = Project(tmp_path, tmp_path / "runs")
    ours = {"ckpt-step000000010.pt": b"step 10", "ckpt-step000000020.pt": b"step 20", "best.pt": b"best at 20"}
    _checkpoints(project.run_home(RUN) / "checkpoints", ours, tuple(ours))
    host_dir = tmp_path / "w1" / "runs" / RUN / "checkpoints"
    _checkpoints(host_dir, {"ckpt-step000000010.pt": b"step 10", "best.pt": b"best at 10"},
                 ("ckpt-step000000010.pt", "best.pt"))
    inventory = load_inventory(tmp_path / "hosts.yaml", tmp_path)
    with sessions_to(inventory.hosts, inventory, tmp_path) as sessions:
        push_checkpoints(select_hosts(inventory, "h1"), sessions, RUN, inventory, project, Renderer())
    listed = parse_manifest((host_dir / "MANIFEST.sha256").read_bytes()).digests()
    assert listed == {"ckpt-step000000010.pt": sha(b"step 10"), "best.pt": sha(b"best at 10"),
                      "ckpt-step000000020.pt": sha(b"step 20")}
    assert {name: sha((host_dir / name).read_bytes()) for name in listed} == listed
    assert sorted(p.name for p in host_dir.iterdir()) == ["MANIFEST.sha256", "best.pt", "ckpt-step000000010.pt",
                                                          "ckpt-step000000020.pt"]  # no temp file left


def _limited(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_the_remote_write_is_whole_or_not_at_all(tmp_path: Path) -> None:
    """The write dies part-way (here: a file-size limit, as a full disk would): the old file stays
    whole and no temp file is left. A plain write_text left the first 1000 bytes under the name."""
    target = tmp_path / "checkpoints" / "MANIFEST.sha256"
    target.parent.mkdir()
    target.write_text("old manifest\n")
    cut = subprocess.run([sys.executable, "-c", WRITE_FILE, str(target), "x" * 5000], preexec_fn=_limited(1000),
                         capture_output=True, text=True, timeout=60)
    assert cut.returncode != 0 and "File too large" in cut.stderr, cut
    assert target.read_text() == "old manifest\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["MANIFEST.sha256"]
    done = subprocess.run([sys.executable, "-c", WRITE_FILE, str(target), "new\n"], capture_output=True, timeout=60)
    assert (done.returncode, target.read_text()) == (0, "new\n")


SAVE_PLAN = """import sys
from pathlib import Path
from meshrun.deploy.edges.comm import save_plan
from meshrun.deploy.run.commplan import CommPlan, Hook
links = tuple((f"h{i}", f"h{i + 1}", 100.0, 1.0) for i in range(200))
save_plan(Path(sys.argv[1]), "r1", CommPlan(2, 125e6, 0.001, 1000, 1.0, (), Hook.NONE, "why", links=links), "none")
"""


def test_commplan_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "r1" / COMM_PLAN
    path.parent.mkdir()
    path.write_text('{"hook": "none"}\n')
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    cut = subprocess.run([sys.executable, "-c", SAVE_PLAN, str(tmp_path)], preexec_fn=_limited(4096),
                         capture_output=True, text=True, timeout=60, env=env)
    assert cut.returncode != 0 and "File too large" in cut.stderr, cut.stderr[-500:]
    assert path.read_text() == '{"hook": "none"}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == [COMM_PLAN]
    done = subprocess.run([sys.executable, "-c", SAVE_PLAN, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-500:]
    assert len(json.loads(path.read_text())["links"]) == 200
