"""`--comm`'s measured figure at a long run's end: the controller asks rank 0's host for the `comm`
lines of its step-metrics file, never the whole file (deploy/edges/commmetrics.py). The file here
is written by the trainer's own writer (train/metrics.py MetricsSink) and grown to the size of days
of steps; the argv runs for real on this machine, as a host's shell runs it (`sh -c` of the
command line deploy/run/shell.py builds), and through a real local session.

Old code: `cat` of the whole file. Over a slow link that ran past the 20 s the end allows; and even
here its answer is the whole file cut to its head and tail (capped.py), where the record of the
second start, in the middle, is lost: it read the first start's world size."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

from meshrun.deploy.edges import comm
from meshrun.deploy.edges.commmetrics import comm_record_argv, last_comm_record
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.inventory.model import LOCAL, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch
from meshrun.deploy.run.shell import remote_command
from meshrun.layout import rank_metrics, run_dir
from meshrun.train.metrics import CommRecord, MetricsSink, StepRecord, as_json
from tests.fakesession import host

RUN = "20260101-000000-comm"
HALF_MIB = 24  # each start's share of the file: 48 MiB in all, days of steps at 5 steps/s


def _comm(world_size: int, at: float) -> CommRecord:
    return CommRecord(rank=0, host="h1", method="no_sync", steps=20, sync_s=0.31, no_sync_s=0.12, comm_s=0.19,
                      world_size=world_size, time=at)


def _step(step: int) -> StepRecord:
    return StepRecord(rank=0, host="h1", epoch=3, global_step=step, samples=640, data_s=0.001, fwd_bwd_s=0.15,
                      optim_s=0.01, step_s=0.2, samples_per_s=160.0, total_samples_per_s=480.0,
                      peak_mem_bytes=2_000_000_000, mem_kind="cuda", time=1.7e9 + step, steps=20)


def _start(folder: Path, world_size: int, first_step: int) -> None:
    """One start of the workers as the trainer writes rank 0's file: its comm probe's record
    first, then step records; the bulk is the same step line again, to reach the size quickly."""
    sink = MetricsSink(folder, 0, False, 10.0, False)
    sink.rank_record(_comm(world_size, 1.7e9 + first_step))
    for step in range(first_step, first_step + 400, 20):
        sink.rank_record(_step(step))
    sink.close()
    line = (json.dumps(as_json(_step(first_step + 400))) + "\n").encode()
    with open(folder / rank_metrics(0), "ab") as f:
        f.write(line * (HALF_MIB * 2**20 // len(line)))


def _a_long_run(workdir: Path) -> Path:
    """Rank 0's metrics file of a run whose host crashed mid-week: the zeros a crash leaves at the
    end of an appended file (no newline after them), then a second start with one host fewer."""
    folder = workdir / run_dir(RUN)
    _start(folder, 3, 0)
    with open(folder / rank_metrics(0), "ab") as f:
        f.write(b"\0" * 4096)
    _start(folder, 2, 500_000)
    path = folder / rank_metrics(0)
    assert path.stat().st_size > 2 * HALF_MIB * 2**20
    return path


def test_the_host_is_asked_for_the_comm_lines_of_rank_0s_file_only() -> None:
    assert comm_record_argv(RUN) == ["grep", "-a", "-F", "-e", '"kind": "comm"', "--",
                                     "runs/20260101-000000-comm/metrics.rank0.jsonl"]


def test_the_argv_run_as_a_host_runs_it_answers_the_two_comm_lines_at_once(tmp_path: Path) -> None:
    path = _a_long_run(tmp_path)
    begun = time.monotonic()
    done = subprocess.run(["sh", "-c", remote_command(str(tmp_path), comm_record_argv(RUN))],
                          capture_output=True, timeout=60, check=True)
    took = time.monotonic() - begun
    first, second = (json.dumps(as_json(_comm(n, at))) for n, at in ((3, 1.7e9), (2, 1.7e9 + 500_000)))
    assert done.stdout == f"{first}\n".encode() + b"\0" * 4096 + f"{second}\n".encode()
    assert last_comm_record(done.stdout.decode()) == as_json(_comm(2, 1.7e9 + 500_000))
    assert took < 10, f"{took:.1f} s for {path.stat().st_size >> 20} MiB"  # grep reads its own disk: tens of ms


def test_read_comm_record_brings_home_a_few_hundred_bytes_and_the_newest_start(tmp_path: Path) -> None:
    """Through a real local session (a host's command, its answer capped as over SSH): what the
    host sends back is the comm lines, and the record is the second start's (world size 2)."""
    _a_long_run(tmp_path)
    local = dataclasses.replace(host(), address=LOCAL, workdir=str(tmp_path))
    plan = plan_launch(Selection((local,), Rendezvous("h1", 29400)), LaunchOptions(RUN), {}, "/venv/bin/python")
    sent: list[int] = []

    class Answers(LocalSession):
        def run(self, argv, **kwargs):  # type: ignore[no-untyped-def]
            result = super().run(argv, **kwargs)
            sent.append(len(result.stdout))
            return result

    found = comm.read_comm_record({"h1": Answers(local, tmp_path)}, plan)
    assert found == as_json(_comm(2, 1.7e9 + 500_000))
    assert len(sent) == 1 and sent[0] < 5000, sent  # the old `cat`: the capped file, over 4 MiB


def test_a_sound_comm_line_after_a_crashs_zeros_is_read_and_a_cut_one_is_not() -> None:
    sound = json.dumps(as_json(_comm(2, 5.0)))
    assert last_comm_record("\0\0\0" + sound) == as_json(_comm(2, 5.0))
    assert last_comm_record(sound + "\n" + '{"rank": 0, "kind": "comm", "comm_s"') == as_json(_comm(2, 5.0))
    assert last_comm_record("\0" * 10) is None
