"""The short last step of an epoch never leaves a rank a single row (train/sampler.py): BatchNorm
in training mode raises on one ("Expected more than 1 value per channel when training"), which
killed BatchNorm models (PointNet++, ResNet) at every epoch's end: ModelNet40's 9843 clouds at
batch 16 on 3 ranks (tail 3: 1/1/1), any train_size = 1 mod the global batch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from meshrun.train.config import CONFIG_DIR
from meshrun.train.loop import micro_steps
from meshrun.train.sampler import (GlobalStep, RankBatch, ResumableBatchSampler, epoch_order,
                                   floor_split, plan_steps, steps_per_epoch)
from tests.test_train_uneven_grad import _worker, max_diff, reference
from tests.trainer.harness import fork_ranks, records, train

SIZES = [(32, 32), (16, 16, 16), (24, 24), (8, 16, 40), (3, 1), (1, 1, 1), (2, 2, 2, 2), (5, 9), (7,)]


def test_a_tail_of_one_rides_with_the_step_before() -> None:
    assert plan_steps(list(range(65)), 0, (32, 32)) == [GlobalStep(
        (RankBatch(tuple(range(33)), 33), RankBatch(tuple(range(33, 65)), 32)), 65)]
    # ModelNet40 at 16 on 3 ranks: 9843 = 205 x 48 + 3, the tail of 3 merged into step 205.
    steps = plan_steps(list(range(9843)), 0, (16, 16, 16))
    assert len(steps) == 205 and [b.real for b in steps[-1].per_rank] == [17, 17, 17]


def test_a_tail_big_enough_gives_every_rank_two_and_the_rest_in_proportion() -> None:
    assert floor_split(10, (8, 16, 40)) == [2, 2, 6]  # in proportion: 1, 3, 6
    assert floor_split(94, (16, 32, 48)) == [16, 31, 47]  # nobody short: proportional_split's
    assert floor_split(5, (8, 16, 40)) is None  # 2 each do not fit: merged
    assert floor_split(2, (3, 1)) == [2, 0]  # a rank of batch 1 is padded, as ever
    last = plan_steps(list(range(74)), 0, (8, 16, 40))[-1]
    assert [b.real for b in last.per_rank] == [2, 2, 6]


def test_padding_up_to_two_rows_only_without_a_step_to_merge_with() -> None:
    [step] = plan_steps(list(range(5)), 0, (3, 3, 3, 3))
    assert [(b.indices, b.real) for b in step.per_rank] == [
        ((0, 1), 2), ((2, 0), 1), ((3, 0), 1), ((4, 0), 1)]


@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_every_rank_two_rows_each_sample_once_and_bounded_batches(sizes: tuple[int, ...]) -> None:
    full = sum(sizes)
    for n in range(1, 4 * full + 3):
        steps = plan_steps(epoch_order(n, 3, 1, True), 0, sizes)
        assert len(steps) == steps_per_epoch(n, sizes)
        used = Counter(i for s in steps for b in s.per_rank for i in b.indices[:b.real])
        assert sorted(used) == list(range(n)) and set(used.values()) == {1}
        for k, step in enumerate(steps):
            assert step.real == sum(b.real for b in step.per_rank)
            extra = step.real - full  # > 0 only in a merged last step
            assert extra <= 0 or k == len(steps) - 1
            for b, size in zip(step.per_rank, sizes):
                assert min(2, size) <= len(b.indices) and b.real <= len(b.indices)
                assert len(b.indices) <= max(size, 2) + max(0, -(-extra * size // full))
                assert len(b.indices) == b.real or b.real < min(2, size)  # padding: only short


@pytest.mark.parametrize("before, after, stop", [((16, 16, 16), (24, 24), 3), ((32, 32), (16, 16, 16), 2),
                                                 ((8, 16, 40), (3, 1), 1), ((5, 9), (9, 5), 4)])
def test_resume_at_other_sizes_still_uses_each_sample_once(before: tuple[int, ...],
                                                           after: tuple[int, ...], stop: int) -> None:
    for n in (97, 98, 145, 146, 147):
        order = epoch_order(n, 11, 2, True)
        first = plan_steps(order, 0, before)[:stop]
        consumed = sum(s.real for s in first)
        samplers = [ResumableBatchSampler(n, after, r, seed=11) for r in range(len(after))]
        for s in samplers:
            s.set_epoch(2, consumed)
        rest = samplers[0].steps
        assert all(list(s) == [list(g.per_rank[r].indices) for g in rest] for r, s in enumerate(samplers))
        taken = [i for s in first + rest for b in s.per_rank for i in b.indices[:b.real]]
        assert sorted(taken) == list(range(n)) and taken[:consumed] == order[:consumed]


def test_a_merged_step_is_still_the_exact_global_batch_gradient(tmp_path: Path) -> None:
    """69 samples at 8/16/40: the tail of 5 rides with the first step (69 = 9/17/43), and the
    3-process DDP step equals one process's step on all 69 (test_train_uneven_grad's check)."""
    sizes, n = (8, 16, 40), 69
    [step] = plan_steps(list(range(n)), 0, sizes)
    assert [b.real for b in step.per_rank] == [9, 17, 43]
    assert {m.scale for r in range(3) for m in micro_steps([step], r, 1)} == {3 / 69}
    fork_ranks(_worker, 3, tmp_path, sizes, 1, n, False)
    expected = reference(sizes, 1, n)
    for rank in range(3):
        assert max_diff(torch.load(tmp_path / f"rank{rank}.pt"), expected) <= 1e-9


@pytest.mark.slow
def test_pointnet_with_a_tail_of_one_trains_on_two_ranks(tmp_path: Path) -> None:
    """65 clouds, 2 ranks x 32 (BatchNorm in every layer): before, rank 0 got 1 sample and rank 1
    one padding slot in a last step of their own, and both raised."""
    run = tmp_path / "run"
    proc = train(run, "data.train_size=65", "data.test_size=32", "data.num_points=64",
                 "model.sa_points=[16,8]", "model.sa_samples=8", "model.width=8", "epochs=1",
                 "log.tensorboard=false", "perf.comm_probe_steps=0",
                 config=CONFIG_DIR / "pointnet2_shapes.yaml")
    assert proc.returncode == 0, proc.stderr
    [epoch] = records(run, kind="epoch")
    assert (epoch["coverage_min"], epoch["coverage_max"], epoch["global_step"]) == (1, 1, 1)
    assert epoch["rank_samples"] == [33, 32]
