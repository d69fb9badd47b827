"""The resumable sampler: exact coverage, equal step counts, and resharding on resume."""

from __future__ import annotations

from collections import Counter

import pytest

from meshrun.train.sampler import ResumableBatchSampler, epoch_order, eval_shard, plan_steps


def real_indices(world: int, batch: int, n: int, epoch: int, consumed: int) -> list[list[int]]:
    """Per step, the real (non-padding) indices of all ranks, read through the samplers."""
    samplers = [ResumableBatchSampler(n, [batch] * world, r, seed=7) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch, consumed)
    assert len({len(s) for s in samplers}) == 1, "every rank must run the same number of steps"
    steps = []
    for k, per_rank in enumerate(zip(*samplers)):
        assert all(b for b in per_rank), "every rank gets a batch (padding when it has no share)"
        reals = [step.real for step in samplers[0].steps[k].per_rank]
        assert max(reals) - min(reals) <= 1, "equal batch sizes: shares differ by at most 1"
        steps.append([i for b, real in zip(per_rank, reals) for i in b[:real]])
    return steps


@pytest.mark.parametrize("world, batch, n", [(1, 4, 10), (2, 4, 10), (3, 4, 10), (4, 3, 5),
                                             (3, 1, 2), (2, 32, 1438)])
def test_each_sample_once_per_epoch(world: int, batch: int, n: int) -> None:
    used = [i for step in real_indices(world, batch, n, epoch=1, consumed=0) for i in step]
    assert sorted(used) == list(range(n))


@pytest.mark.parametrize("world, batch, n", [(2, 4, 10), (3, 4, 10), (4, 3, 5), (3, 1, 2)])
def test_real_counts_add_up_and_padding_only_for_empty_shares(world: int, batch: int, n: int) -> None:
    for step in plan_steps(epoch_order(n, 0, 0, True), 0, [batch] * world):
        assert sum(b.real for b in step.per_rank) == step.real
        for b in step.per_rank:
            assert len(b.indices) == max(b.real, min(2, batch))  # BatchNorm needs 2 rows in training


@pytest.mark.parametrize("old_world, new_world, stop_after", [(2, 3, 2), (3, 2, 1), (2, 2, 3),
                                                             (4, 1, 1), (1, 4, 5)])
def test_resume_at_another_world_size_covers_rest_exactly_once(
        old_world: int, new_world: int, stop_after: int) -> None:
    n, batch, epoch = 101, 4, 3
    before = real_indices(old_world, batch, n, epoch, consumed=0)[:stop_after]
    consumed = sum(len(step) for step in before)
    after = real_indices(new_world, batch, n, epoch, consumed)
    used = Counter(i for step in before + after for i in step)
    assert sorted(used) == list(range(n)) and set(used.values()) == {1}
    # The consumed prefix is exactly the first samples of the epoch's (world-independent) order.
    assert [i for s in before for i in s] == epoch_order(n, 7, epoch, True)[:consumed]


def test_epochs_shuffle_differently_and_deterministically() -> None:
    assert epoch_order(50, 1, 0, True) != epoch_order(50, 1, 1, True)
    assert epoch_order(50, 1, 2, True) == epoch_order(50, 1, 2, True)
    assert epoch_order(5, 1, 0, False) == [0, 1, 2, 3, 4]


def test_eval_shard_has_no_padding() -> None:
    shards = [eval_shard(11, 4, r) for r in range(4)]
    assert sorted(i for s in shards for i in s) == list(range(11))
