"""Coverage in one bit per sample (train.coverage): exact (fewest, most) uses whenever the bitmaps
prove them, None whenever they cannot, checked against counting by brute force; and
``EpochTally.finish`` on 3 real gloo ranks gives the exact counts' answer in a healthy epoch (one
bit per sample crossed), with a gap, after a resume (the consumed prefix counted once), with two
ranks sharing a sample and with a rank that saw a sample twice (then the exact counts cross
too), every rank alike."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from meshrun.train import coverage
from meshrun.train.tally import EpochTally
from tests.trainer.harness import fork_ranks


def counts_of(indices: list[int], n: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(indices, dtype=torch.int64), minlength=n)


def summed(ranks: list[list[int]], n: int) -> tuple[torch.Tensor, int, int]:
    """What the all-reduce gives: the bitmaps summed as uint8 (wrapping, as the wire does)."""
    seen = [coverage.pack(counts_of(r, n)) for r in ranks]
    bits = torch.zeros_like(seen[0].bits)
    for s in seen:
        bits += s.bits
    return bits, sum(s.distinct for s in seen), sum(int(s.repeated) for s in seen)


def test_pack_sets_one_bit_per_seen_sample() -> None:
    seen = coverage.pack(counts_of([0, 3, 8, 9, 9], 10))
    assert seen.bits.tolist() == [0b00001001, 0b00000011]
    assert (seen.distinct, seen.repeated) == (4, True)
    empty = coverage.pack(counts_of([], 10))
    assert (empty.bits.tolist(), empty.distinct, empty.repeated) == ([0, 0], 0, False)


@pytest.mark.parametrize("ranks, expected", [
    ([[0, 1, 2], [3, 4], [5, 6, 7, 8]], (1, 1)),  # a partition
    ([[0, 1], [3, 4], [5, 6, 7, 8]], (0, 1)),  # sample 2 unseen
    ([[], [], []], (0, 0)),
    ([[7], [7]], None),  # 128 + 128 wraps to 0 in the byte: still caught
    ([[0, 1], [1, 2]], None),
    ([[0, 0, 1], [2]], None),  # one rank saw sample 0 twice
])
def test_verdict_cases(ranks: list[list[int]], expected: tuple[int, int] | None) -> None:
    n = 9 if expected != (0, 0) else 4
    assert coverage.verdict(*summed(ranks, n), n) == expected


def test_verdict_agrees_with_brute_force_or_declines() -> None:
    """Random epochs, from healthy ones to many ranks piling onto the same samples: a verdict is
    always the brute force answer, and None exactly when some sample was used more than once."""
    rng = random.Random(7)
    for case in range(400):
        n, world = rng.randint(1, 70), rng.randint(1, 300 if case % 10 == 0 else 6)
        order = list(range(n))
        rng.shuffle(order)
        if case % 3 == 0:  # a partition, maybe with gaps
            cut = sorted(rng.randint(0, n) for _ in range(world - 1))
            ranks = [order[a:b] for a, b in zip([0, *cut], [*cut, n])]
            ranks = [[i for i in r if rng.random() > 0.05] for r in ranks]
        else:  # anything
            ranks = [[rng.randrange(n) for _ in range(rng.randint(0, 8))] for _ in range(world)]
        total = sum((counts_of(r, n) for r in ranks), torch.zeros(n, dtype=torch.int64))
        got = coverage.verdict(*summed(ranks, n), n)
        if int(total.max()) > 1:
            assert got is None, (case, ranks)
        else:
            assert got == (int(total.min()), int(total.max())), (case, ranks)


CASES = {  # rank -> indices it trained on (rank 0 also holds the prefix, as after a resume)
    "partition": [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]],
    "gap": [[0, 1, 2, 3], [4, 5], [7, 8, 9, 10, 11]],
    "shared": [[0, 1, 2, 3], [3, 4, 5, 6], [7, 8, 9, 10, 11, 3]],
    "twice": [[0, 1, 2, 3], [4, 5, 6, 6, 6], [7, 8, 9, 10, 11]],
    "resumed": [[3], [4, 5, 6], [7, 8, 9, 10, 11]],  # 0, 1, 2 consumed before the resume
    "redone": [[2, 3], [4, 5, 6], [7, 8, 9, 10, 11]],  # 2 consumed before and trained again
}
PREFIX = {"resumed": [0, 1, 2], "redone": [0, 1, 2]}  # counted once, on the main rank
N = 12


def _tally(rank: int, world: int, port: int, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from meshrun.train import dist

    calls: list[list[int]] = []  # each sum's tensors' sizes: the exact counts follow only a sample used twice
    started = dist.start_sums
    dist.start_sums = lambda *t: (calls.append([x.numel() for x in t]), started(*t))[1]  # type: ignore[assignment]
    results = {}
    for name, ranks in CASES.items():
        calls.clear()
        tally = EpochTally(torch.device("cpu"), N, PREFIX.get(name, []), rank == 0)
        mine = torch.tensor(ranks[rank], dtype=torch.int64)
        tally.add(torch.tensor(1.0, dtype=torch.float64), torch.tensor(1), mine, len(mine))
        t = tally.finish()
        results[name] = [t.coverage_min, t.coverage_max, list(t.rank_samples), t.count, list(calls)]
    Path(out, f"{rank}.json").write_text(json.dumps(results))
    torch_dist.destroy_process_group()


def test_tally_on_three_ranks_matches_the_exact_counts(tmp_path: Path) -> None:
    fork_ranks(_tally, 3, str(tmp_path))
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    assert got[0] == got[1] == got[2]
    for name, ranks in CASES.items():
        total = sum((counts_of(r, N) for r in ranks), counts_of(PREFIX.get(name, []), N))
        sizes = [len(r) for r in ranks]
        sums = [[3 + 3, 3 + 2, 2]] + ([[N]] if int(total.max()) > 1 else [])  # floats, ints, 12 bits; counts
        assert got[0][name] == [int(total.min()), int(total.max()), sizes, sum(sizes), sums], name
