"""summary.json's `restarts` for a `fab train --script` run.

It was always 0: the count came only from the built-in trainer's result.json, and a script writes
none, so an elastic script run whose worker group restarted at every lost or joining host said it
never restarted. Now the script runner (deploy/host/runscript.py) counts each start of the group on
its host, in `<run dir>/starts.json` under `<launch's rendezvous id>@<host>` (hosts that share a workdir,
an NFS home, share the file: stop51 #6), the controller reads every answering host's own count in the round that read result.json before (deploy/commands/trainend.py), and
the summary takes the largest that the run's timeline allows (deploy/run/summary.py);
with no count, what the timeline shows. Pure: the runner as torchrun starts it (a subprocess with
torchrun's environment), the summary and the read from the real functions, hosts faked."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from meshrun import layout
from meshrun.deploy.commands import trainend
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.host import runscript
from meshrun.deploy.inventory.model import ElasticBounds, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.membership import OUTLIVED_DETAIL, Change, MembershipEvent
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, Workload, plan_launch
from meshrun.deploy.run.summary import build_summary, end_files, end_read, host_starts, seen_restarts, starts_cap
from tests.fakesession import DEEP, FakeSession, host

RUN = "20260101-000000-5c1d"
RDZV = f"{RUN}-ab12"  # a resumed launch's rendezvous id: the key of its starts
SCRIPT = "print('script ran')\n"


# --- the runner: each start of the worker group, counted on its host ---------------------------------

def start_rank(workdir: Path, local_rank: int = 0, rdzv: str = RDZV, restart_count: int = 0,
               run_id: str = RUN, on: str = "h1") -> subprocess.CompletedProcess[str]:
    """One rank as torchrun starts it under meshrun's agent: in the workdir, with torchrun's and the agent's variables."""
    (workdir / "job.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "MESHRUN_"))}
    env.update({"LOCAL_RANK": str(local_rank), "RANK": str(local_rank), "TORCHELASTIC_RUN_ID": rdzv,
                "TORCHELASTIC_RESTART_COUNT": str(restart_count), layout.ENV_RUN_ID: run_id,
                layout.ENV_HOST: on, layout.ENV_RUN_DIR: str(workdir / layout.run_dir(run_id))})
    return subprocess.run([sys.executable, "-m", layout.SCRIPT_RUNNER_MODULE, "job.py"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)


def starts_file(workdir: Path) -> Path:
    return workdir / layout.run_dir(RUN) / layout.STARTS_FILE


K1 = f"{RDZV}@h1"  # h1's key for the launch


def test_each_start_of_the_worker_group_is_counted_by_its_hosts_first_local_rank(tmp_path: Path) -> None:
    """A membership change restarts the group without raising TORCHELASTIC_RESTART_COUNT (both starts
    below have 0); a failure restart raises it. Either way it is one more start. A succession
    generation's rendezvous id is the same launch; a resume's fresh id counts afresh beside it."""
    for restart_count in (0, 0, 1):
        done = start_rank(tmp_path, restart_count=restart_count)
        assert (done.returncode, done.stdout, done.stderr) == (0, "script ran\n", "")
    assert json.loads(starts_file(tmp_path).read_text()) == {K1: 3}
    assert start_rank(tmp_path, local_rank=1).returncode == 0  # the host's other ranks count nothing
    start_rank(tmp_path, rdzv=f"{RDZV}-g2")  # the rendezvous moved (succession): still this launch
    start_rank(tmp_path, rdzv=f"{RUN}-cd34")  # `fab train --resume`: a new launch
    assert json.loads(starts_file(tmp_path).read_text()) == {K1: 4, f"{RUN}-cd34@h1": 1}
    assert [p.name for p in starts_file(tmp_path).parent.iterdir()] == [layout.STARTS_FILE]  # no temp left


def test_a_script_run_by_hand_records_nothing(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "MESHRUN_"))} | {"LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, "-m", layout.SCRIPT_RUNNER_MODULE, "job.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "script ran\n")
    assert not (tmp_path / layout.RUNS_DIR).exists()
    assert start_rank(tmp_path, run_id="../escape").returncode == 0  # not a run id: nothing written anywhere
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]


def test_a_count_that_cannot_be_recorded_never_stops_or_blocks_the_script(tmp_path: Path) -> None:
    """The run dir is a file; starts.json a FIFO (its read would block), a symlink (its write would go
    elsewhere), damaged JSON: the script runs every time, silently, and the count restarts where it can."""
    (tmp_path / layout.RUNS_DIR).mkdir()
    (tmp_path / layout.run_dir(RUN)).write_text("not a directory")
    done = start_rank(tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "script ran\n", "")
    (tmp_path / layout.run_dir(RUN)).unlink()
    starts_file(tmp_path).parent.mkdir()
    os.mkfifo(starts_file(tmp_path))
    assert (start_rank(tmp_path).stdout, json.loads(starts_file(tmp_path).read_text())) == ("script ran\n", {K1: 1})
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({K1: 40}))
    starts_file(tmp_path).unlink()
    starts_file(tmp_path).symlink_to(outside)
    assert start_rank(tmp_path).stdout == "script ran\n"
    assert not starts_file(tmp_path).is_symlink() and json.loads(starts_file(tmp_path).read_text()) == {K1: 1}
    assert json.loads(outside.read_text()) == {K1: 40}
    for damaged in ("{", "[3]", json.dumps({K1: "7", "other": 2}), json.dumps({K1: True})):
        starts_file(tmp_path).write_text(damaged)
        assert start_rank(tmp_path).stdout == "script ran\n"
        assert json.loads(starts_file(tmp_path).read_text())[K1] == 1


def test_the_runners_copies_are_the_layouts() -> None:
    """The check ships runscript.py alone to hosts that may have no meshrun, so it keeps its own copies."""
    assert (runscript.RUNS_DIR, runscript.STARTS_FILE, runscript.ENV_RUN_ID, runscript.ENV_HOST) == (
        layout.RUNS_DIR, layout.STARTS_FILE, layout.ENV_RUN_ID, layout.ENV_HOST)
    assert runscript._RUN_ID.pattern == layout._RUN_ID.pattern
    for rdzv in ("r-1", "r-1-g3", "r-1-g", "r-gx", "r-g١", "-g2"):
        assert runscript.launch_rdzv_id(rdzv) == layout.launch_rdzv_id(rdzv)


# --- the summary: the hosts' counts, within what the run allows; else the timeline -------------------

def a_plan(count: int = 4, elastic: ElasticBounds | None = ElasticBounds(2, 4)) -> LaunchPlan:
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.0.0.{i}", nproc=2)
                  for i in range(1, count + 1))
    options = LaunchOptions(RUN, Workload(script="job.py"), elastic=elastic, rdzv_id=RDZV)
    return plan_launch(Selection(hosts, Rendezvous("h1", 29400)), options, {}, "/v/python")


def event(t: float, change: Change, name: str, detail: str | None = None) -> MembershipEvent:
    return MembershipEvent(t, change, name, 0, detail)


# Four hosts, MIN 2: h3 and h4 are cut at once (one restart of h1 and h2), then h3 comes back (another).
STARTED = tuple(event(1.0, Change.STARTED, f"h{i}") for i in range(1, 5))
TWO_AT_ONCE = (*STARTED, event(5.0, Change.LOST, "h3"), event(5.1, Change.LOST, "h4"),
               event(9.0, Change.JOINED, "h3"),
               *(event(20.0, Change.FINISHED, name) for name in ("h1", "h2", "h3")))


def outcome_of(events: tuple[MembershipEvent, ...]) -> JobOutcome:
    return JobOutcome(RUN, JobStatus.SUCCEEDED, 0.0, 20.0, tuple(HostOutcome(f"h{i}", 0, Path(f"h{i}.log"), ())
                                                                    for i in range(1, 5)), events=events)


def test_the_hosts_largest_count_is_the_runs_starts() -> None:
    """h1 and h2 saw 3 starts, h3 its own 2 (the first, and the one that admitted it back). The
    timeline alone would say 3 restarts: two losses 0.1 s apart restarted the group once."""
    summary = build_summary(a_plan(), outcome_of(TWO_AT_ONCE), None, starts=[3, 3, 2])
    assert (summary.restarts, summary.world_size, summary.lost_hosts) == (2, 0, ["h3", "h4"])
    assert build_summary(a_plan(), outcome_of(TWO_AT_ONCE), None, starts=[2]).restarts == 1  # only h3 answered
    assert seen_restarts(a_plan(), TWO_AT_ONCE) == 3


def test_without_any_count_the_summary_says_what_the_timeline_shows_not_zero() -> None:
    """No host answered (all unreachable, or every read failed): the restarts the controller saw."""
    assert build_summary(a_plan(), outcome_of(TWO_AT_ONCE), None).restarts == 3
    assert build_summary(a_plan(), outcome_of(TWO_AT_ONCE), None, starts=[0, -1]).restarts == 3
    # A loss below MIN ends the run, restarting nothing; a host admitted after training finished (outlived) was never in it.
    ending = (*STARTED[:2], event(4.0, Change.LOST, "h2"), event(5.0, Change.FINISHED, "h1"))
    assert seen_restarts(a_plan(2, ElasticBounds(2, 3)), ending) == 0
    late = (*STARTED[:2], event(4.0, Change.JOINED, "h3"), event(5.0, Change.FINISHED, "h1"),
            event(5.0, Change.FINISHED, "h2"), event(6.0, Change.FINISHED, "h3", OUTLIVED_DETAIL))
    assert seen_restarts(a_plan(3, ElasticBounds(2, 3)), late) == 0
    assert seen_restarts(a_plan(2, None), (*STARTED[:2], event(4.0, Change.LOST, "h2"))) == 0  # a fixed run


def test_the_trainers_agreed_count_still_wins_where_it_wrote_one() -> None:
    result = {"world_size": 4, "restarts": 1, "epochs_completed": 3}
    assert build_summary(a_plan(), outcome_of(TWO_AT_ONCE), result, starts=[3]).restarts == 1


def test_a_host_that_claims_a_huge_count_moves_the_summary_no_further_than_the_run_allows() -> None:
    """The cap of TWO_AT_ONCE: the first start, 3 changes of membership, and 5 torchruns (4 started,
    1 joined) with 10 failure restarts each (--max-restarts, elastic): 54 starts. A count past it is
    no honest one and is left out; when it is the only count, the cap stands for it."""
    plan = a_plan()
    assert starts_cap(plan, TWO_AT_ONCE) == 1 + 3 + 5 * 10
    assert build_summary(plan, outcome_of(TWO_AT_ONCE), None, starts=[3, 10**40, 2]).restarts == 2
    assert build_summary(plan, outcome_of(TWO_AT_ONCE), None, starts=[2, 55]).restarts == 1
    assert build_summary(plan, outcome_of(TWO_AT_ONCE), None, starts=[2, 54]).restarts == 53  # within the bound
    assert build_summary(plan, outcome_of(TWO_AT_ONCE), None, starts=[10**40]).restarts == 53
    fixed = a_plan(elastic=None)  # no restart budget, no membership changes: only ever one start
    assert build_summary(fixed, outcome_of(STARTED), None, starts=[7]).restarts == 0


@pytest.mark.parametrize("text, count", [
    (json.dumps({K1: 3, RUN: 9}), 3), (json.dumps({K1: 10**30}), 10**30),  # judged by the summary
    ("", None), ("not json", None), ("[3]", None), (json.dumps({RUN: 3}), None), (json.dumps({K1: "3"}), None),
    (json.dumps({K1: True}), None), (json.dumps({K1: 2.0}), None), (json.dumps({K1: 0}), None),
    (json.dumps({K1: -4}), None), ('{"%s": 1e400}' % K1, None), ('{"%s": %s}' % (K1, "9" * 5000), None),
    (json.dumps({RDZV: 3}), None), (json.dumps({f"{RDZV}@h2": 3}), None),  # not h1's own count
    (DEEP, None), (json.dumps({K1: 2, "pad": "x" * (64 << 10)}), None),  # cut at the read's limit
])
def test_a_hosts_answer_of_any_shape_is_a_count_or_none(text: str, count: int | None) -> None:
    assert host_starts(text, RDZV, "h1") == count


# --- the read: one bounded command per answering host, where result.json was read ----------------------

def test_a_script_runs_end_reads_every_answering_hosts_count_once_and_no_result_json(tmp_path: Path) -> None:
    asked: dict[str, list[Sequence[str]]] = {}
    answers = {"h1": json.dumps({K1: 3}), "h2": json.dumps({f"{RDZV}@h2": 10**40}), "h3": json.dumps({K1: 5}),
               "h4": json.dumps({f"{RDZV}@h4": 9})}  # h3 answers h1's count only: none of its own

    def session(name: str) -> FakeSession:
        def answer(argv: Sequence[str]) -> str:
            asked.setdefault(name, []).append(list(argv))
            return f"==> runs/{RUN}/starts.json <==\n{answers[name]}"  # as tail heads it
        return FakeSession(answer, the_host=dataclasses.replace(host(), name=name))

    plan = a_plan()
    record = RunRecord(RUN, "/p/inventory.yaml", ("h1", "h2", "h3", "h4"), 0.0, False, "10.0.0.1:29400", RDZV,
                       (2, 4), {"script": "job.py", "config": None, "args": []})
    outcome = dataclasses.replace(outcome_of(TWO_AT_ONCE), hosts=(
        *outcome_of(TWO_AT_ONCE).hosts[:3], HostOutcome("h4", None, Path("h4.log"), ())))  # h4: lost, not asked
    summary = trainend.gathered(plan, outcome, record, {f"h{i}": session(f"h{i}") for i in range(1, 5)},
                                Project(tmp_path, tmp_path / "runs"), Renderer(), Beside(lambda: None))
    assert asked == {name: [end_read(end_files(RUN, name, trainer=False))] for name in ("h1", "h2", "h3")}
    assert summary.restarts == 2  # h1's 3 starts; h2's 10**40 is past the cap (see above), h3 out of shape
    ends = trainend.read_ends({"h1": session("h1"), "h3": session("h3")}, plan, RDZV, script=True)
    assert [end.starts for end in ends] == [3, None]


def test_hosts_sharing_one_workdir_count_one_start_once_each(tmp_path: Path) -> None:
    """An NFS home: h1's and h2's LOCAL_RANK 0 both write the one starts.json. One start of the group
    is one start: each host's read finds its own 1, and a run that never restarted says 0."""
    for name in ("h1", "h2"):
        assert start_rank(tmp_path, on=name).returncode == 0
    text = starts_file(tmp_path).read_text()
    assert json.loads(text) == {K1: 1, f"{RDZV}@h2": 1}
    counts = [host_starts(text, RDZV, name) for name in ("h1", "h2")]
    assert counts == [1, 1] and build_summary(a_plan(), outcome_of(STARTED), None, starts=counts).restarts == 0
