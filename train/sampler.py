"""A resumable, reshardable distributed batch sampler with per-rank batch sizes, and the exact
evaluation shard.

Contract (``plan_steps`` / ``ResumableBatchSampler``):
- An epoch's sample order is ``permutation(seed, epoch)``; it depends on neither the world size
  nor the batch sizes.
- ``consumed`` samples of that order are skipped; the rest is cut into global steps of
  ``B = sum(batch_sizes)`` samples, rank ``r`` taking the ``r``-th contiguous slice of length
  ``batch_sizes[r]``. Every rank therefore runs the same number of steps, and every sample of
  the epoch is used exactly once.
- Remainder policy: the last global step may be short (``c < B`` samples). It is split in
  proportion to the batch sizes (largest remainder, ties to the lower rank), so the slowest
  rank still gets the largest share, except that no rank of batch size ``b_r >= 2`` gets fewer
  than 2 samples (``MIN_ROWS``: BatchNorm in training mode refuses a batch of one, which
  crashed BatchNorm models at every epoch's end): a rank below that gets 2, and the rest is
  split in proportion over the others. A short step too small for that (``c`` below 2 per such
  rank) is merged into the step before it, one step of ``B + c`` split the same way (a rank
  gets at most a few samples more than its batch). A rank left with fewer rows than
  ``min(2, b_r)`` gets *padding* slots up to that: indices of the epoch that count for nothing
  (``real`` excludes them), so every rank still takes the step (DDP needs every rank). That
  happens only to a rank of batch size 1 with no share, and when no step comes before a short
  one to merge with (an epoch, or the rest of one after a resume, that small).
- Padding slots are always at the end of a rank's batch: ``indices[:real]`` are the real ones.
- The gradient of the global batch, ``sum_i b_i * mean_i / B``, is obtained by scaling each
  rank's *sum* of real-sample losses by ``world_size / real_in_window`` (``train.loop``); DDP's
  division by the world size then leaves the mean over all real samples of the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch.utils.data import Dataset, Sampler


# Rows every rank's batch has at least (its batch size if smaller): BatchNorm in training mode
# raises on a single row ("Expected more than 1 value per channel when training").
MIN_ROWS = 2


@dataclass(frozen=True)
class RankBatch:
    indices: tuple[int, ...]
    real: int  # indices[:real] are real samples; the rest are zero-weight padding


@dataclass(frozen=True)
class GlobalStep:
    """One step across all ranks: each rank's batch and how many real samples all consume."""

    per_rank: tuple[RankBatch, ...]
    real: int


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(num_samples))
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_samples, generator=gen).tolist()


def proportional_split(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights``: floors, then the largest remainders get one
    more (ties to the lower index). Sums to ``total`` exactly."""
    norm = sum(weights)
    assert total >= 0 and norm > 0 and all(w >= 0 for w in weights)
    exact = [total * w / norm for w in weights]
    shares = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[:total - sum(shares)]:
        shares[i] += 1
    return shares


def floor_split(total: int, batch_sizes: Sequence[int]) -> list[int] | None:
    """``total`` split in proportion to ``batch_sizes`` with no rank of batch ``b >= MIN_ROWS``
    below ``MIN_ROWS``: those below get that, and the rest is split again over the others until
    none is below. None when ``total`` is below the sum of the minimums. Equals
    ``proportional_split`` when that leaves no rank below. (A rank of batch 1 needs no real
    sample: it is padded, as its every step has one row anyway.)"""
    least = [MIN_ROWS if b >= MIN_ROWS else 0 for b in batch_sizes]
    if total < sum(least):
        return None
    fixed: set[int] = set()
    while True:  # each pass fixes at least one rank; some rank always stays free (sum >= least)
        free = [r for r in range(len(batch_sizes)) if r not in fixed]
        split = proportional_split(total - sum(least[r] for r in fixed),
                                   [batch_sizes[r] for r in free])
        low = {r for r, share in zip(free, split) if share < least[r]}
        if not low:
            shares = dict(zip(free, split)) | {r: least[r] for r in fixed}
            return [shares[r] for r in range(len(batch_sizes))]
        fixed |= low


def plan_steps(order: list[int], consumed: int, batch_sizes: Sequence[int]) -> list[GlobalStep]:
    """Pure layout of the rest of an epoch (see module docstring)."""
    assert batch_sizes and all(b >= 1 for b in batch_sizes)
    rest, full = order[consumed:], sum(batch_sizes)
    starts = list(range(0, len(rest), full))
    if len(starts) > 1 and floor_split(len(rest) - starts[-1], batch_sizes) is None:
        starts.pop()  # the short tail rides with the step before it
    steps = []
    for k, start in enumerate(starts):
        chunk = rest[start:starts[k + 1] if k + 1 < len(starts) else len(rest)]
        shares = list(batch_sizes) if len(chunk) == full else floor_split(len(chunk), batch_sizes)
        if shares is None:  # nothing to merge with: real samples in proportion, then padding
            shares = proportional_split(len(chunk), batch_sizes)
        per_rank, at = [], 0
        for share, b in zip(shares, batch_sizes):
            pad = tuple(order[(consumed + start + j) % len(order)]
                        for j in range(min(MIN_ROWS, b) - share))
            per_rank.append(RankBatch(tuple(chunk[at:at + share]) + pad, share))
            at += share
        steps.append(GlobalStep(per_rank=tuple(per_rank), real=len(chunk)))
    return steps


def steps_per_epoch(num_samples: int, batch_sizes: Sequence[int]) -> int:
    """How many global steps ``plan_steps`` makes of a whole epoch (a merged tail is none)."""
    full, tail = divmod(num_samples, sum(batch_sizes))
    if tail == 0:
        return full
    return full if full and floor_split(tail, batch_sizes) is None else full + 1


class ResumableBatchSampler(Sampler[list[int]]):
    """Batch sampler for ``DataLoader(batch_sampler=...)``; ``batch_sizes`` is indexed by rank."""

    def __init__(self, num_samples: int, batch_sizes: Sequence[int], rank: int, seed: int,
                 shuffle: bool = True) -> None:
        assert 0 <= rank < len(batch_sizes) and num_samples > 0
        self.num_samples, self.batch_sizes = num_samples, tuple(batch_sizes)
        self.rank, self.seed, self.shuffle = rank, seed, shuffle
        self.set_epoch(0)

    @property
    def global_batch(self) -> int:
        return sum(self.batch_sizes)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Start ``epoch`` with its first ``consumed`` samples already used (by any world size
        and any batch sizes)."""
        assert 0 <= consumed <= self.num_samples
        self.epoch, self.consumed = epoch, consumed
        self.order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        self.steps = plan_steps(self.order, consumed, self.batch_sizes)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps:
            yield list(step.per_rank[self.rank].indices)


class IndexedDataset(Dataset):
    """Wraps a dataset so that item ``i`` is ``(*dataset[i], i)``: the trainer counts which
    samples really reached the model (per-epoch coverage in the metrics)."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple:
        x, y = self.inner[index]
        return x, y, index


def eval_shard(num_samples: int, world_size: int, rank: int) -> list[int]:
    """Rank ``r``'s evaluation indices: every sample on exactly one rank, no padding."""
    return list(range(rank, num_samples, world_size))
