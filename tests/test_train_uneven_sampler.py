"""Per-rank batch sizes in the sampler and the allocator: proportional shards, equal step
counts, each sample once per epoch, resume with other sizes and world sizes."""

from __future__ import annotations

from collections import Counter

import pytest

from meshrun.train.balance import allocate
from meshrun.train.errors import UsageError
from meshrun.train.sampler import ResumableBatchSampler, epoch_order, plan_steps, proportional_split


def real_steps(sizes: tuple[int, ...], n: int, epoch: int, consumed: int) -> list[list[list[int]]]:
    """Per step, per rank, the real indices, read through one sampler per rank."""
    samplers = [ResumableBatchSampler(n, sizes, r, seed=5) for r in range(len(sizes))]
    for s in samplers:
        s.set_epoch(epoch, consumed)
    assert len({len(s) for s in samplers}) == 1, "every rank must run the same number of steps"
    out = []
    for k, batches in enumerate(zip(*samplers)):
        reals = [b.real for b in samplers[0].steps[k].per_rank]
        out.append([batch[:real] for batch, real in zip(batches, reals)])
    return out


@pytest.mark.parametrize("sizes, n", [((16, 32, 48), 1438), ((8, 16, 40), 64), ((1, 2, 5), 7),
                                      ((3, 1), 10), ((16, 32, 48), 2), ((7,), 20)])
def test_every_sample_once_and_full_steps_proportional(sizes: tuple[int, ...], n: int) -> None:
    steps = real_steps(sizes, n, epoch=2, consumed=0)
    used = [i for step in steps for rank in step for i in rank]
    assert sorted(used) == list(range(n))
    assert len(steps) == -(-n // sum(sizes))
    for step in steps[:-1] if n % sum(sizes) else steps:
        assert [len(rank) for rank in step] == list(sizes)


def test_remainder_is_split_in_proportion() -> None:
    # digits: 1438 = 14 x 96 + 94; 94 over 16:32:48 -> 15.67, 31.33, 47 -> 16, 31, 47.
    last = plan_steps(list(range(1438)), 0, (16, 32, 48))[-1]
    assert [b.real for b in last.per_rank] == [16, 31, 47] and last.real == 94
    assert proportional_split(94, (16, 32, 48)) == [16, 31, 47]
    assert proportional_split(2, (8, 16, 40)) == [0, 1, 1]  # rank 0's share is 0: padded
    padded = plan_steps(list(range(2)), 0, (8, 16, 40))[0].per_rank[0]
    assert padded.real == 0 and len(padded.indices) == 2  # two rows: BatchNorm refuses one in training


@pytest.mark.parametrize("before, after, stop", [((16, 32, 48), (48, 48), 3), ((8, 16, 40), (32,), 1),
                                                 ((32, 32), (16, 32, 48), 5), ((5, 9), (9, 5), 2)])
def test_resume_with_other_sizes_and_world_covers_rest_once(
        before: tuple[int, ...], after: tuple[int, ...], stop: int) -> None:
    n, epoch = 437, 4
    first = real_steps(before, n, epoch, consumed=0)[:stop]
    consumed = sum(len(rank) for step in first for rank in step)
    rest = real_steps(after, n, epoch, consumed)
    used = Counter(i for step in first + rest for rank in step for i in rank)
    assert sorted(used) == list(range(n)) and set(used.values()) == {1}
    assert [i for step in first for rank in step for i in rank] == epoch_order(n, 5, epoch, True)[:consumed]


def test_allocate_follows_speed_and_respects_caps() -> None:
    assert allocate(96, [1.0, 2.0, 3.0], [0, 0, 0]) == [16, 32, 48]
    assert sum(allocate(97, [1.0, 1.0, 1.0], [0, 0, 0])) == 97
    assert allocate(96, [1.0, 2.0, 3.0], [0, 0, 20]) == [25, 51, 20]  # capped rank's excess moves
    assert allocate(3, [1.0, 1000.0, 1000.0], [0, 0, 0]) == [1, 1, 1]  # at least one each
    with pytest.raises(UsageError, match="does not fit in the ranks' memory caps"):
        allocate(96, [1.0, 1.0], [40, 40])
    with pytest.raises(UsageError, match="smaller than the 3 auto-sized ranks"):
        allocate(2, [1.0, 1.0, 1.0], [0, 0, 0])
