"""A resumable, reshardable distributed batch sampler, and the exact evaluation shard.

Contract (``ResumableBatchSampler``):
- An epoch's sample order is ``permutation(seed, epoch)``; it does not depend on the world size.
- ``consumed`` samples of that order are skipped; the rest is cut into global steps of
  ``world_size * batch_size`` samples, rank ``r`` taking the ``r``-th contiguous slice.
- The last global step may be short. It is split evenly (ceil) and topped up with padding
  slots whose weight is 0, so every rank runs the same number of steps with the same batch shape
  but each real sample contributes exactly once.
- Each yielded batch is a list of ``(index, weight)``; with per-sample losses multiplied by the
  weight and summed, DDP's average over ranks equals the mean over the global step's real
  samples: ``weight = world_size / real_samples_in_global_step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.data import Dataset, Sampler

Slot = tuple[int, float]


@dataclass(frozen=True)
class GlobalStep:
    """One step across all ranks: per-rank slots and how many real samples it consumes."""

    per_rank: tuple[tuple[Slot, ...], ...]
    real: int


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(num_samples))
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_samples, generator=gen).tolist()


def plan_steps(order: list[int], consumed: int, world_size: int, batch_size: int) -> list[GlobalStep]:
    """Pure layout of the rest of an epoch (see module docstring)."""
    rest = order[consumed:]
    full = world_size * batch_size
    steps = []
    for start in range(0, len(rest), full):
        chunk = rest[start:start + full]
        per = math.ceil(len(chunk) / world_size)
        pads = [order[i % len(order)] for i in range(per * world_size - len(chunk))]
        weight = world_size / len(chunk)
        slots = [(i, weight) for i in chunk] + [(i, 0.0) for i in pads]
        per_rank = tuple(tuple(slots[r * per:(r + 1) * per]) for r in range(world_size))
        steps.append(GlobalStep(per_rank=per_rank, real=len(chunk)))
    return steps


class ResumableBatchSampler(Sampler[list[Slot]]):
    """Batch sampler for ``DataLoader(batch_sampler=...)`` over a ``WeightedDataset``."""

    def __init__(self, num_samples: int, batch_size: int, world_size: int, rank: int,
                 seed: int, shuffle: bool = True) -> None:
        assert 0 <= rank < world_size and batch_size > 0 and num_samples > 0
        self.num_samples, self.batch_size = num_samples, batch_size
        self.world_size, self.rank = world_size, rank
        self.seed, self.shuffle = seed, shuffle
        self.set_epoch(0)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Start ``epoch`` with its first ``consumed`` samples already used (by any world size)."""
        assert 0 <= consumed <= self.num_samples
        self.epoch, self.consumed = epoch, consumed
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        self.steps = plan_steps(order, consumed, self.world_size, self.batch_size)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[list[Slot]]:
        for step in self.steps:
            yield list(step.per_rank[self.rank])


class WeightedDataset(Dataset):
    """Wraps a dataset so that item ``(index, weight)`` returns ``(*dataset[index], weight)``."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, slot: Slot) -> tuple:
        index, weight = slot
        x, y = self.inner[index]
        return x, y, torch.tensor(weight, dtype=torch.float32)


def eval_shard(num_samples: int, world_size: int, rank: int) -> list[int]:
    """Rank ``r``'s evaluation indices: every sample on exactly one rank, no padding."""
    return list(range(rank, num_samples, world_size))
