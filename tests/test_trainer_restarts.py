"""summary.json's `restarts` for a built-in trainer run that failed or was stopped (docs51 #2).

The trainer's agreed count reached the controller only through result.json, which it writes at
success only; for any other end the summary fell back to the timeline, which does not show
torchrun's restarts of failed workers. An elastic run whose rank hit CUDA OOM, restarted ten times
by torchrun (--max-restarts 10) and then given up, said `restarts: 0` while every host's
`runs/<id>/starts.json` held `{<rdzv id>: 11}` (train/starts.py). Now, when no result.json holds the
count, the controller reads each answering host's starts.json under the trainer's key (the launch's
rendezvous id alone, not a --script runner's `<rdzv id>@<host>`) in the end's one bounded read of it
(`read_ends`, which reads its agent's exit.json and rank 0's progress and epochs too), and the
summary takes the largest the run's timeline allows (deploy/run/summary.py `restarts_of`). Pure: the
trainer's own writer (train/starts.py, no process group: one rank) and the controller's read and
summary from the real functions, hosts faked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import pytest
import torch

from meshrun import layout
from meshrun.deploy.commands import trainend
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.inventory.model import ElasticBounds, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.membership import Change, MembershipEvent
from meshrun.deploy.run.outcome import HostOutcome, JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, Workload, plan_launch
from meshrun.deploy.run.summary import end_files, end_read, host_starts, max_restarts, starts_cap
from meshrun.train.starts import count_start
from tests.fakesession import DEEP, FakeSession, host

RUN = "20260101-000000-5c1d"
RDZV = f"{RUN}-ab12"  # a resumed launch's rendezvous id: the trainer's key in starts.json
RESULT = f"runs/{RUN}/{layout.RESULT}"
STARTS = f"runs/{RUN}/{layout.STARTS_FILE}"


def read(name: str, trainer: bool = True) -> list[str]:
    """The end's one read of host `name` (`trainer`: no result.json, rank 0's files too)."""
    return end_read(end_files(RUN, name, trainer))


def a_plan(count: int = 2) -> LaunchPlan:
    """The built-in trainer (no --script), elastic count:count, so torchrun restarts failed workers."""
    hosts = tuple(dataclasses.replace(host(), name=f"h{i}", address=f"10.0.0.{i}", nproc=1)
                  for i in range(1, count + 1))
    options = LaunchOptions(RUN, Workload(), elastic=ElasticBounds(count, count), rdzv_id=RDZV)
    return plan_launch(Selection(hosts, Rendezvous("h1", 29400)), options, {}, "/v/python")


def ended(plan: LaunchPlan, status: JobStatus = JobStatus.FAILED) -> JobOutcome:
    """Every host started and ran to the end (rc 1): no change of membership the controller saw."""
    names = [h.host.name for h in plan.hosts]
    events = tuple(MembershipEvent(1.0, Change.STARTED, name, len(names), None) for name in names)
    return JobOutcome(RUN, status, 0.0, 600.0, tuple(HostOutcome(name, 1, Path(f"{name}.log"), ()) for name in names),
                      failed_host=None, events=events)


def a_record(plan: LaunchPlan) -> RunRecord:
    names = tuple(h.host.name for h in plan.hosts)
    return RunRecord(RUN, "/p/inventory.yaml", names, 0.0, False, "10.0.0.1:29400", RDZV,
                     (len(names), len(names)), {"script": None, "config": None, "args": []})


def gathered(tmp_path: Path, plan: LaunchPlan, outcome: JobOutcome, starts: dict[str, str],
             result: str = "", asked: dict[str, list[list[str]]] | None = None) -> int:
    """The run's end as `fab train` reads it: each host answers `cat result.json` with `result` (""
    as a host without the file: `cat` prints nothing) and the end's read with its starts.json's text,
    as tail heads it (a host without the file: nothing)."""
    def session(name: str) -> FakeSession:
        def answer(argv: Sequence[str]) -> str:
            (asked if asked is not None else {}).setdefault(name, []).append(list(argv))
            if argv[-1] == RESULT:
                return result
            return f"==> {STARTS} <==\n{starts[name]}" if name in starts and STARTS in argv else ""
        return FakeSession(answer, the_host=dataclasses.replace(host(), name=name))
    sessions = {h.host.name: session(h.host.name) for h in plan.hosts}
    summary = trainend.gathered(plan, outcome, a_record(plan), sessions, Project(tmp_path, tmp_path / "runs"),
                                Renderer(), Beside(lambda: None))
    return summary.restarts


def test_a_failed_trainer_runs_restarts_are_the_count_its_hosts_agreed(tmp_path: Path) -> None:
    """Ten OOM restarts, then torchrun gave up: each host's leader wrote the group's 11th start."""
    plan = a_plan()
    assert max_restarts(plan) == 10
    asked: dict[str, list[list[str]]] = {}
    eleven = json.dumps({RDZV: 11})
    assert gathered(tmp_path, plan, ended(plan), {"h1": eleven, "h2": eleven}, asked=asked) == 10
    assert asked == {name: [["cat", RESULT], read(name)] for name in ("h1", "h2")}  # one bounded read each
    assert gathered(tmp_path, plan, ended(plan, JobStatus.STOPPED), {"h1": eleven}) == 10  # Ctrl-C, --idle-stop
    oom = dataclasses.replace(ended(plan), failed_host="h2")  # the checkpoint hint is read too; the count stands
    assert gathered(tmp_path, plan, oom, {"h1": eleven, "h2": eleven}) == 10
    # A host lost early holds an older count: the largest answered is the group's.
    assert gathered(tmp_path, plan, ended(plan), {"h1": json.dumps({RDZV: 4}), "h2": eleven}) == 10


def test_the_trainers_writer_and_the_controllers_reader_use_one_key(tmp_path: Path) -> None:
    """train/starts.py keys by the launch's rendezvous id (a succession generation's id is the same
    launch): what it writes on a host is what the controller reads back from that host."""
    run_dir = tmp_path / layout.run_dir(RUN)
    for rdzv in (RDZV, RDZV, f"{RDZV}-g1"):
        count_start(run_dir, layout.launch_rdzv_id(rdzv), True, torch.device("cpu"))
    text = (run_dir / layout.STARTS_FILE).read_text()
    assert json.loads(text) == {RDZV: 3}
    assert (host_starts(text, RDZV, None), host_starts(text, RDZV, "h1")) == (3, None)  # not a script's key


def test_the_starts_are_not_read_where_result_json_holds_the_count(tmp_path: Path) -> None:
    plan = a_plan()
    asked: dict[str, list[list[str]]] = {}
    result = json.dumps({"world_size": 2, "restarts": 1, "epochs_completed": 3})
    assert gathered(tmp_path, plan, ended(plan, JobStatus.SUCCEEDED), {"h1": json.dumps({RDZV: 11})}, result,
                    asked) == 1
    assert asked == {name: [["cat", RESULT]] for name in ("h1", "h2")}  # asked together; no starts.json read
    damaged = json.dumps({"world_size": 2, "restarts": -1})  # out of shape: no count of its own
    assert gathered(tmp_path, plan, ended(plan), {"h2": json.dumps({RDZV: 3})}, damaged) == 2


# A host is untrusted: whatever its starts.json says is data, judged by the read and by `restarts_of`.
HOSTILE = ["not json", DEEP, "[11]", json.dumps({RDZV: True}), json.dumps({RDZV: "11"}), json.dumps({RDZV: 11.0}),
           json.dumps({RDZV: -11}), json.dumps({RDZV: 0}), '{"%s": 1e400}' % RDZV, '{"%s": %s}' % (RDZV, "9" * 5000),
           json.dumps({RUN: 30}), json.dumps({f"{RUN}-cd34": 30}),  # another launch of the run: another count
           json.dumps({f"{RDZV}@h1": 30}),  # a --script runner's key: not the trainer's count
           json.dumps({RDZV: 11, "pad": "x" * (64 << 10)})]  # cut at the read's limit: no whole object


@pytest.mark.parametrize("text", HOSTILE)
def test_an_answer_out_of_shape_or_for_another_launch_counts_no_start(text: str) -> None:
    assert host_starts(text, RDZV, None) is None


def test_hostile_hosts_do_not_move_the_count_past_the_honest_one(tmp_path: Path) -> None:
    """Eight hosts, one honest (4 starts): garbage, a bool, another run's key and a huge number leave
    it at 3. A count past what the run allows (`starts_cap`: the first start and each of the eight
    torchruns' 10 failure restarts) is no honest one; only when no honest count answered does the
    cap stand, and no further."""
    plan = a_plan(8)
    cap = starts_cap(plan, ended(plan).events)
    assert cap == 1 + 8 * 10
    liars = [json.dumps({RDZV: 10**40}), json.dumps({RDZV: cap + 1}), "not json", json.dumps({RDZV: True}),
             json.dumps({RUN: 30}), json.dumps({f"{RDZV}@h6": 30}), DEEP]
    answers = {f"h{i}": text for i, text in enumerate([json.dumps({RDZV: 4}), *liars], start=1)}
    assert gathered(tmp_path, plan, ended(plan), answers) == 3
    assert gathered(tmp_path, plan, ended(plan), {"h2": json.dumps({RDZV: 10**40})}) == cap - 1
    nothing = {name: text for name, text in answers.items() if name not in ("h1", "h2", "h3")}
    assert gathered(tmp_path, plan, ended(plan), nothing) == 0  # no count: the timeline's (no change seen)
