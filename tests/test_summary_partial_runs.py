"""summary.json of a built-in trainer run that was stopped or failed (day2 #4).

result.json is written at success only (train/metrics.py), and the summary took epochs_completed,
metrics and best_test_acc from it alone: a run stopped with Ctrl-C after 22 epochs, or one that failed
at epoch 174, said `epochs_completed: 0`, `metrics: {}`, `best_test_acc: null`; and a fixed run that
failed said `world_size: 0` (the size after its one host's `lost`). A script that picks runs worth
resuming by epochs_completed skipped exactly those. Now, without result.json, the end's one read per
host (deploy/commands/trainend.py `read_ends`) brings rank 0's progress.json and the end of its
metrics.jsonl too, and the summary takes the epochs done, the last epoch's metrics and the best
accuracy from them (deploy/run/summary.py `trained`); a fixed run's world_size is the launch's. The
files are written by the trainer's own writer (train/metrics.py MetricsSink) and read by real `tail`.

Only the hosts that held rank 0 are read, and only records of the run (stop54-attacker #3): every
answering host's records were merged, so a member that never held rank 0 serving `epoch 2147483647,
time 1e300, test_acc 0.999` set the run's epochs_completed and best accuracy. Which host held rank 0 is
torch's own rule (`rank0_hosts`, checked against this torch's rendezvous); a record before the run's
first start, after its end, or past the epochs it was to train (`-- epochs=N`) is none of its own."""

from __future__ import annotations

import calendar
import dataclasses
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping, Sequence

import pytest

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
from meshrun.deploy.run.progress import parse_progress
from meshrun.deploy.run.summary import (CLOCK_SKEW_S, END_READ_MAX, EpochEnd, HostEnd, RecordBounds, build_summary,
                                        end_files, end_read, epoch_ends, host_end, rank0_hosts, run_began, split_tail,
                                        trained)
from meshrun.train.metrics import EpochRecord, MetricsSink, ProgressRecord, as_json
from tests.fakesession import DEEP, HostFiles, host

RUN = "20261206-180949-ad17"
RDZV = RUN
T0 = float(calendar.timegm((2026, 12, 6, 18, 9, 49, 0, 0, 0)))  # the run's id: its first start, UTC


def read_all(*names: str) -> RecordBounds:
    """Bounds that keep every record of `names`' (the rules of `trained` apart from whose and when)."""
    return RecordBounds(frozenset(names), 0.0, 1e11)


def a_plan(names: Sequence[str] = ("h1",), elastic: ElasticBounds | None = None) -> LaunchPlan:
    return plan_at({name: f"10.0.0.{i}" for i, name in enumerate(names, 1)}, elastic)


def plan_at(addresses: Mapping[str, str], elastic: ElasticBounds | None = None) -> LaunchPlan:
    """Hosts at these addresses (two processes each), the first the rendezvous host."""
    hosts = tuple(dataclasses.replace(host(), name=name, address=address, nproc=2)
                  for name, address in addresses.items())
    options = LaunchOptions(RUN, Workload(), elastic=elastic, rdzv_id=RDZV)
    return plan_launch(Selection(hosts, Rendezvous(hosts[0].name, 29400)), options, {}, "/v/python")


def started(plan: LaunchPlan, *later: tuple[Change, str]) -> tuple[MembershipEvent, ...]:
    """The launch's `started` events, then `later`'s changes (world sizes are not what is read here)."""
    return (*(MembershipEvent(1.0, Change.STARTED, h.host.name, 0) for h in plan.hosts),
            *(MembershipEvent(10.0 + i, change, name, 0) for i, (change, name) in enumerate(later)))


def an_outcome(status: JobStatus, names: Sequence[str] = ("h1",), lost: Sequence[str] = ()) -> JobOutcome:
    events = [MembershipEvent(1.0, Change.STARTED, name, 2 * i) for i, name in enumerate(names, 1)]
    size = 2 * len(names)
    for i, name in enumerate(lost, 1):
        events.append(MembershipEvent(60.0 + i, Change.LOST, name, size - 2 * i, "exit status 1"))
    hosts = tuple(HostOutcome(name, 1 if name in lost else 130, Path(f"{name}.log"), ()) for name in names)
    reason = f"host '{lost[0]}' exited with status 1" if lost else "interrupted (Ctrl-C)"
    return JobOutcome(RUN, status, T0 + 5, T0 + 70, hosts, failed_host=lost[0] if lost else None, reason=reason,
                      events=tuple(events))


def epoch(n: int, acc: float, at: float, loss: float = 0.1) -> EpochRecord:
    return EpochRecord(n, 0.2, loss, acc, 1.0, 0.1, 2, 45 * n, at, 100 * n, 1.0, 0.1)


def progress(done: int, step: int, at: float) -> ProgressRecord:
    return ProgressRecord(done, 7, 45, step, 2, at, 100 * done, 200)


def trainer_files(workdir: Path, epochs: Sequence[EpochRecord], last: ProgressRecord | None) -> None:
    """What rank 0 leaves in its run dir, written by the trainer's own writer: config, epochs, progress."""
    sink = MetricsSink(workdir / layout.run_dir(RUN), 0, True, 0.0, False)
    sink.config({"epochs": 200})
    for record in epochs:
        sink.event(record)
    if last is not None:
        sink.progress(last, force=True)
    sink.close()


# --- the pure rules -----------------------------------------------------------------------------------

def test_a_stopped_runs_summary_has_what_rank_0_recorded() -> None:
    """Ctrl-C in epoch 23 of 200: 22 done; the last evaluated metrics; the best of the 22."""
    records = tuple(EpochEnd(n, T0 + 10 + n, 0.9 + n / 1000, 0.5 - n / 100) for n in range(1, 23))
    ends = [HostEnd("h1", starts=1, progress=parse_progress(as_json(progress(22, 997, T0 + 60))), epochs=records)]
    summary = build_summary(a_plan(), an_outcome(JobStatus.STOPPED), None, ends=ends)
    assert (summary.status, summary.epochs_completed, summary.metrics, summary.best_test_acc, summary.world_size,
            summary.restarts) == ("stopped", 22, {"test_acc": 0.922, "test_loss": 0.28}, 0.922, 2, 0)


def test_a_failed_fixed_runs_world_size_is_the_launchs() -> None:
    """Two hosts of two processes; h2 failed: the run had 4 processes, not the 2 left after it."""
    summary = build_summary(a_plan(("h1", "h2")), an_outcome(JobStatus.FAILED, ("h1", "h2"), ("h2",)), None)
    assert (summary.status, summary.world_size, summary.epochs_completed, summary.metrics,
            summary.best_test_acc) == ("failed", 4, 0, {}, None)
    one = build_summary(a_plan(), an_outcome(JobStatus.FAILED, lost=("h1",)), None)
    assert (one.world_size, one.timeline[-1]["world_size"]) == (2, 0)  # the timeline keeps what it saw


def test_an_elastic_runs_world_size_is_its_final_one_and_not_0_when_every_host_was_lost() -> None:
    plan = a_plan(("h1", "h2"), ElasticBounds(1, 2))
    assert build_summary(plan, an_outcome(JobStatus.SUCCEEDED, ("h1", "h2"), ("h2",)), None).world_size == 2
    below = an_outcome(JobStatus.FAILED, ("h1", "h2"), ("h2", "h1"))  # 4, then 2, then 0
    assert build_summary(plan, below, None).world_size == 2  # the last it ran with


def test_result_json_wins_over_what_the_hosts_files_say() -> None:
    ends = [HostEnd("h1", progress=parse_progress(as_json(progress(5, 225, 10.0))),
                    epochs=(EpochEnd(5, 10.0, 0.5, 0.4),))]
    result = {"epochs_completed": 20, "metrics": {"test_acc": 0.98}, "best_test_acc": 0.985, "world_size": 2}
    summary = build_summary(a_plan(), an_outcome(JobStatus.FAILED, lost=("h1",)), result, ends=ends)
    assert (summary.epochs_completed, summary.metrics, summary.best_test_acc) == (20, {"test_acc": 0.98}, 0.985)


def test_epochs_from_every_host_that_held_rank_0_the_record_written_last_wins() -> None:
    """An elastic run whose rendezvous host (rank 0's) was lost: rank 0 went on on h2, whose file
    starts later; a resume redid epoch 3 (a better accuracy is the one kept, as `fab report` keeps it)."""
    h1 = HostEnd("h1", progress=parse_progress(as_json(progress(3, 135, 30.0))),
                 epochs=(EpochEnd(1, 10.0, 0.5, 0.9), EpochEnd(2, 20.0, 0.8, 0.5), EpochEnd(3, 30.0, 0.95, 0.3)))
    h2 = HostEnd("h2", progress=parse_progress(as_json(progress(4, 190, 45.0))),
                 epochs=(EpochEnd(3, 35.0, 0.85, 0.35), EpochEnd(4, 44.0, 0.9, None)))
    assert trained([h1, h2], read_all("h1", "h2")) == {"epochs_completed": 4, "metrics": {"test_acc": 0.9},
                                                       "best_test_acc": 0.9}
    assert trained([h1], read_all("h1")) == {"epochs_completed": 3, "metrics": {"test_acc": 0.95, "test_loss": 0.3},
                             "best_test_acc": 0.95}
    mid = HostEnd("h3", progress=parse_progress(as_json(progress(7, 320, 50.0))))  # in epoch 8: 7 done
    assert trained([mid], read_all("h3")) == {"epochs_completed": 7}
    assert trained([dataclasses.replace(h1, epochs_cut=True)], read_all("h1")) == {
        "epochs_completed": 3, "metrics": {"test_acc": 0.95, "test_loss": 0.3}}  # its best may be in what was not read
    assert trained([HostEnd("h1"), HostEnd("h2", starts=3)], read_all("h1", "h2")) == {}


def test_a_metrics_files_end_of_any_shape_gives_its_sound_epochs_only() -> None:
    good = json.dumps(as_json(epoch(3, 0.9, 30.0)))
    lines = [good, json.dumps({**as_json(epoch(4, 0.9, 40.0)), "test_acc": 1.5}),
             json.dumps({**as_json(epoch(5, 0.9, 50.0)), "epoch": True}),
             json.dumps({**as_json(epoch(6, 0.9, 60.0)), "time": "now"}),
             json.dumps({**as_json(epoch(7, 0.9, 70.0)), "kind": "step"}), DEEP + '"epoch"', "[1]", '"epoch"',
             json.dumps({**as_json(epoch(8, 0.9, 80.0)), "test_loss": float("nan")}),
             json.dumps({**as_json(epoch(9, 0.9, 90.0)), "test_loss": 10**400})]
    text = "\n".join(lines) + "\n"
    assert epoch_ends(text, cut=False) == (EpochEnd(3, 30.0, 0.9, 0.1), EpochEnd(8, 80.0, 0.9, None),
                                           EpochEnd(9, 90.0, 0.9, None))
    assert epoch_ends(text, cut=True) == (EpochEnd(8, 80.0, 0.9, None), EpochEnd(9, 90.0, 0.9, None))


def test_rank_0_is_on_the_host_with_the_least_address_of_each_round() -> None:
    assert rank0_hosts(a_plan(("h1", "h2")), started(a_plan(("h1", "h2")))) == {"h1"}
    plan = plan_at({"h9": "10.0.0.9", "h10": "10.0.0.10"})  # compared as strings, as torch compares them
    assert rank0_hosts(plan, started(plan)) == {"h10"}
    assert rank0_hosts(plan, ()) == frozenset()  # no host started: nobody held rank 0
    shared = plan_at({"a": "10.0.0.1", "b": "10.0.0.1", "c": "10.0.0.2"})  # torchrun's pid decides: both count
    assert rank0_hosts(shared, started(shared)) == {"a", "b"}
    fixed = a_plan(("h1", "h2", "h3"))  # its first change ended it: no round after it
    assert rank0_hosts(fixed, started(fixed, (Change.LOST, "h1"))) == {"h1"}
    elastic = a_plan(("h1", "h2", "h3"), ElasticBounds(1, 3))
    assert rank0_hosts(elastic, started(elastic, (Change.LOST, "h1"), (Change.JOINED, "h0"))) == {"h1", "h2"}
    assert rank0_hosts(elastic, started(elastic, (Change.FINISHED, "h2"), (Change.LOST, "h1"))) == {"h1"}
    assert rank0_hosts(elastic, started(elastic, (Change.LEFT, "h1"), (Change.JOINED, "h1"))) == {"h1", "h2"}
    two = a_plan(("h1", "h2", "h3"), ElasticBounds(3, 3))  # below its minimum after h1's loss: no round
    assert rank0_hosts(two, started(two, (Change.LOST, "h1"))) == {"h1"}


def test_the_rank_0_rule_is_this_torchs_rendezvous() -> None:
    """torch's own rank assignment, on node descriptors made from the plan's torchrun argv."""
    rendezvous = pytest.importorskip("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    plan = plan_at({"h9": "10.0.0.9", "h10": "10.0.0.10", "h2": "10.0.0.2"})
    state = rendezvous._RendezvousState()
    for pid, launch in zip((1, 2, 3), plan.hosts):  # the least pid is h9's: the address decides
        state.participants[rendezvous._NodeDesc(launch.torchrun[launch.torchrun.index("--local-addr") + 1], pid, 0)] = 0
    executor = rendezvous._DistributedRendezvousOpExecutor(
        next(iter(state.participants)), SimpleNamespace(state=state), SimpleNamespace(run_id=RDZV))
    executor._state = state  # what its `run` sets before a round's operations
    executor._mark_rendezvous_complete()
    first = next(node.addr for node, rank in state.participants.items() if rank == 0)
    assert {h.host.name for h in plan.hosts if h.host.address == first} == rank0_hosts(plan, started(plan)) == {"h10"}


def test_a_member_that_never_held_rank_0_sets_no_epoch_or_accuracy(tmp_path: Path) -> None:
    """The attack: rank 0 (h1) reached epoch 3 at 0.41; evil, never rank 0, serves a forged record past
    any bound, one that looks like the run's own, and a progress.json of its own. Read by real `tail`."""
    plan, outcome = a_plan(("h1", "evil")), an_outcome(JobStatus.STOPPED, ("h1", "evil"))
    honest = [epoch(n, acc, T0 + 10 * n) for n, acc in ((1, 0.39), (2, 0.4), (3, 0.41))]
    trainer_files(tmp_path / "h1", honest, progress(3, 140, T0 + 35))
    forged = [{"kind": "epoch", "epoch": 2147483647, "time": 1e300, "test_acc": 0.999},
              {**as_json(epoch(4, 0.999, T0 + 40)), "kind": "epoch"}]
    evil = tmp_path / "evil" / layout.run_dir(RUN)
    evil.mkdir(parents=True)
    (evil / layout.METRICS).write_text("".join(json.dumps(row) + "\n" for row in forged))
    (evil / layout.PROGRESS).write_text(json.dumps(as_json(progress(150, 6750, T0 + 50))))
    sessions = {name: HostFiles(name, tmp_path / name, []) for name in ("h1", "evil")}
    record = RunRecord(RUN, "/p/inventory.yaml", ("h1", "evil"), T0, False, "10.0.0.1:29400", RDZV, None,
                       {"script": None, "config": None, "args": []})
    summary = trainend.gathered(plan, outcome, record, sessions, Project(tmp_path, tmp_path / "runs"), Renderer(),
                                Beside(lambda: None))
    assert (summary.epochs_completed, summary.metrics, summary.best_test_acc) == (
        3, {"test_acc": 0.41, "test_loss": 0.1}, 0.41)


def test_records_outside_the_run_are_none_of_its_own() -> None:
    """Even rank 0's: a record before the run's first start, after its end, or past the epochs it was to
    train (`-- epochs=5`) is left out; within a day of either end (a host's clock off), it counts."""
    sound = (EpochEnd(1, T0 - CLOCK_SKEW_S + 1, 0.5, 0.9), EpochEnd(2, T0 + 70 + CLOCK_SKEW_S - 1, 0.6, 0.8))
    odd = (EpochEnd(3, T0 - CLOCK_SKEW_S - 1, 0.97, 0.1), EpochEnd(4, 1e300, 0.98, 0.1),
           EpochEnd(6, T0 + 50, 0.99, 0.1))
    late = parse_progress(as_json(progress(9, 400, T0 + 60)))  # past the 5 epochs
    ends = [HostEnd("h1", progress=late, epochs=sound + odd)]
    summary = build_summary(a_plan(), an_outcome(JobStatus.STOPPED), None, ends=ends, epochs=5)
    assert (summary.epochs_completed, summary.metrics, summary.best_test_acc) == (
        2, {"test_acc": 0.6, "test_loss": 0.8}, 0.6)
    unbounded = build_summary(a_plan(), an_outcome(JobStatus.STOPPED), None, ends=ends)  # epochs not known
    assert (unbounded.epochs_completed, unbounded.best_test_acc) == (9, 0.99)
    assert (run_began(RUN), run_began("check-run")) == (T0, None)


@pytest.mark.parametrize("args, epochs", [
    (["epochs=200"], 200), (["optim.lr=0.1", "epochs=5", "epochs=7"], 7), (("epochs=3",), 3), ([], None),
    (["optim.lr=0.1"], None), (["epochs=5", "epochs=x"], None), (["epochs=1_000"], None), (["epochs=010"], None),
    (["epochs=-1"], None), (["epochs=" + "9" * 12], None), (["epochs=٣"], None), ("epochs=3", None), (None, None),
    ([3, "epochs=4"], 4),
])
def test_the_epochs_a_run_was_to_train_are_its_last_plain_override(args: object, epochs: int | None) -> None:
    assert trainend.configured_epochs(args) == epochs


# --- the read: real files, real tail --------------------------------------------------------------------

def test_tails_answer_is_split_back_into_its_files(tmp_path: Path) -> None:
    files = ["a.json", "gone.json", "b.jsonl", "empty", "c"]
    (tmp_path / "a.json").write_text('{"a": 1}')  # no newline at its end
    (tmp_path / "b.jsonl").write_text('{"b": 1}\n\n==> a.json <==\n{"b": 2}\n')  # a line like a header of another
    (tmp_path / "empty").write_text("")
    (tmp_path / "c").write_text("x" * 10)
    done = subprocess.run(["tail", "-c", "5", "--", *files], cwd=tmp_path, capture_output=True, text=True)
    assert split_tail(done.stdout, files) == {"a.json": '": 1}', "b.jsonl": ': 2}\n', "empty": "", "c": "xxxxx"}
    done = subprocess.run(end_read(files), cwd=tmp_path, capture_output=True, text=True)
    assert split_tail(done.stdout, files) == {"a.json": '{"a": 1}', "b.jsonl": (tmp_path / "b.jsonl").read_text(),
                                              "empty": "", "c": "x" * 10}
    assert split_tail("", files) == {} and split_tail("garbage\n==> c <==", files) == {}


def test_a_metrics_file_past_the_read_is_read_from_its_end(tmp_path: Path) -> None:
    """A long run's metrics.jsonl: its last epochs are read, the first line (cut) left out, no best."""
    record = json.dumps(as_json(epoch(1, 0.5, 1.0)))
    count = END_READ_MAX // len(record) + 10
    lines = [json.dumps(as_json(epoch(n, 0.5 + n / (4 * count), float(n)))) for n in range(1, count + 1)]
    files = end_files(RUN, "h1", trainer=True)
    path = tmp_path / files[3]
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(end_read(files), cwd=tmp_path, capture_output=True, text=True)
    end = host_end("h1", done.stdout, files, RDZV, False)
    assert (end.epochs_cut, end.epochs[-1].epoch, end.epochs[0].epoch > 10) == (True, count, True)
    assert trained([end], read_all("h1")) == {
        "epochs_completed": count, "metrics": {"test_acc": 0.5 + count / (4 * count), "test_loss": 0.1}}



def test_the_end_of_a_stopped_run_reads_rank_0s_files_in_the_same_round_as_the_starts(tmp_path: Path) -> None:
    """The evidence's run: `-- epochs=200`, Ctrl-C in epoch 23; two hosts, rank 0 on h1."""
    plan, asked = a_plan(("h1", "h2")), []
    records = [epoch(n, 0.9 + n / 1000, T0 + 10 + n) for n in range(1, 23)]
    trainer_files(tmp_path / "h1", records, progress(22, 1035, T0 + 60))
    for name in ("h1", "h2"):
        (tmp_path / name / layout.run_dir(RUN)).mkdir(parents=True, exist_ok=True)
        (tmp_path / name / layout.run_dir(RUN) / layout.STARTS_FILE).write_text(json.dumps({RDZV: 1}))
    sessions = {name: HostFiles(name, tmp_path / name, asked) for name in ("h1", "h2")}
    record = RunRecord(RUN, "/p/inventory.yaml", ("h1", "h2"), 0.0, False, "10.0.0.1:29400", RDZV, None,
                       {"script": None, "config": None, "args": ["epochs=200"]})
    summary = trainend.gathered(plan, an_outcome(JobStatus.STOPPED, ("h1", "h2")), record, sessions,
                                Project(tmp_path, tmp_path / "runs"), Renderer(), Beside(lambda: None))
    result = ["cat", f"runs/{RUN}/result.json"]
    assert sorted(asked) == sorted([(name, result) for name in ("h1", "h2")]
                                   + [(name, end_read(end_files(RUN, name, trainer=True))) for name in ("h1", "h2")])
    assert (summary.status, summary.epochs_completed, summary.metrics, summary.best_test_acc, summary.world_size,
            summary.restarts) == ("stopped", 22, {"test_acc": 0.922, "test_loss": 0.1}, 0.922, 4, 0)
