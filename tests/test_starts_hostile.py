"""A start count is bookkeeping and never stops training (sec51 finding 2).

At every start the ranks all-gather their hosts' recorded counts (train/starts.py `count_start`)
and each host leader writes one past the largest into its starts.json. A compromised host's rank
sent 2**63-1: every honest host wrote 2**63, and at the next start of the launch (a host lost or
joining, the hostile one's leaving included) every honest rank failed in `Trainer.__init__` with
`ValueError: Overflow when unpacking long long` building the int64 tensor, so an elastic run ended
failed with enough honest hosts up. Now a count out of [0, STARTS_LIMIT) is ignored both when
gathered from a peer and when read from the file (which an earlier start may have poisoned).
Real gloo ranks (forked), one of them hostile; results written to files and asserted here."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
from pathlib import Path

import torch
import torch.distributed as torch_dist

from meshrun.layout import STARTS_FILE
from meshrun.train import dist
from meshrun.train.starts import STARTS_LIMIT, agreed_starts, count_start, read_starts
from tests.trainer.harness import fork_ranks, free_port

RDZV = "rdzv-A"
CPU = torch.device("cpu")


def _group(rank: int, world: int, port: int) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world, timeout=datetime.timedelta(seconds=60))


def _counted(run_dir: Path) -> dict[str, object]:
    """count_start's number (or the error it raised), what it warned, and the file it left."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            number: object = count_start(run_dir, RDZV, True, CPU)
    except Exception as err:  # the old code's failure, reported to the test as data
        number = f"{type(err).__name__}: {err}"
    return {"count": number, "warned": said.getvalue(), "file": json.loads((run_dir / STARTS_FILE).read_text())
            if (run_dir / STARTS_FILE).exists() else None}


def _hostile_start(rank: int, world: int, port: int, base: str) -> None:
    _group(rank, world, port)
    if rank == 1:  # the hostile rank: the largest int64 as its host's recorded count
        real = dist.all_gather_ints
        dist.all_gather_ints = lambda value, device: real(2**63 - 1, device)
    first = _counted(Path(base, f"host{rank}"))
    torch_dist.destroy_process_group()
    out = {"first": first}
    if rank == 0:  # the launch's next start, the hostile host gone: the honest one alone reads its file
        _group(0, 1, free_port())
        out["second"] = _counted(Path(base, "host0"))
        torch_dist.destroy_process_group()
    Path(base, f"r{rank}.json").write_text(json.dumps(out))


def test_a_hostile_ranks_count_is_ignored_and_the_next_start_counts_on(tmp_path: Path) -> None:
    fork_ranks(_hostile_start, 2, str(tmp_path))
    honest = json.loads((tmp_path / "r0.json").read_text())
    assert (honest["first"]["count"], honest["first"]["file"]) == (1, {RDZV: 1})
    assert "rank(s) 1 out of range" in honest["first"]["warned"]
    assert (honest["second"]["count"], honest["second"]["file"], honest["second"]["warned"]) == (2, {RDZV: 2}, "")


# What a host's starts.json may hold after an earlier start under the old code (2**63 from a peer's
# 2**63-1), or damaged: none is a count, and none may stop the start.
POISONED = [{RDZV: 2**63}, {RDZV: 2**64 + 5}, {RDZV: STARTS_LIMIT}, {RDZV: -1}, {RDZV: -(2**63) - 1}, {RDZV: True}]


def _poisoned_files(rank: int, world: int, port: int, base: str) -> None:
    _group(rank, world, port)  # one rank, a real group: all_gather_ints builds its int64 tensor
    out = []
    for index, recorded in enumerate(POISONED):
        run_dir = Path(base, f"run{index}")
        run_dir.mkdir()
        (run_dir / STARTS_FILE).write_text(json.dumps({**recorded, "older-launch": 4}))
        out.append(_counted(run_dir))
    torch_dist.destroy_process_group()
    Path(base, "out.json").write_text(json.dumps(out))


def test_a_poisoned_starts_file_counts_as_no_start(tmp_path: Path) -> None:
    fork_ranks(_poisoned_files, 1, str(tmp_path))
    out = json.loads((tmp_path / "out.json").read_text())
    assert [(o["count"], o["file"]) for o in out] == [(1, {RDZV: 1, "older-launch": 4})] * len(POISONED)


def test_the_agreed_count_takes_the_largest_count_in_range() -> None:
    assert agreed_starts([3, 2**63 - 1, -5, 7, STARTS_LIMIT, STARTS_LIMIT - 1], warn=False) == STARTS_LIMIT
    assert agreed_starts([3, 2**63 - 1, -5, 7], warn=False) == 8
    assert agreed_starts([2**63 - 1], warn=False) == 1  # no count in range: the first start


def test_the_read_keeps_counts_in_range_only(tmp_path: Path) -> None:
    path = tmp_path / STARTS_FILE
    path.write_text('{"a": 3, "b": %d, "c": -1, "d": true, "e": 2.0, "f": %s, "g": 0}' % (2**63, "9" * 5000))
    assert read_starts(path) == {}  # an int past 4300 digits fails the whole parse: damaged, no counts
    path.write_text(json.dumps({"a": 3, "b": 2**63, "c": -1, "d": True, "e": 2.0, "g": 0, "h": STARTS_LIMIT - 1}))
    assert read_starts(path) == {"a": 3, "g": 0, "h": STARTS_LIMIT - 1}
    path.write_text("[" * 100_000)
    assert read_starts(path) == {}
