"""Per-epoch training sums, weighted by samples, and the proof that every sample was used once.

Contract: ``EpochTally.add`` is called once per micro-step with device tensors (no host sync);
``EpochTally.finish`` is collective (it all-reduces) and returns the same ``EpochTotals`` on
every rank. Loss and accuracy are sums over real samples divided by the number of real samples
of all ranks, so a rank with a bigger batch weighs more, exactly as in one big batch.
Coverage counts how often each sample index reached the model in this epoch, over all ranks,
with the samples consumed before a resume counted once (they are, by the sampler's contract,
the epoch order's first ``consumed`` indices); ``train.coverage`` sends it as one bit per
sample when that proves the answer, and the exact counts only when it does not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from meshrun.train import coverage, dist


@dataclass(frozen=True)
class EpochTotals:
    loss_sum: float  # all ranks, real samples
    correct: int
    count: int
    rank_samples: tuple[int, ...]  # real samples each rank used in this process's epoch
    rank_seconds: tuple[float, ...]  # each rank's wall time for them
    coverage_min: int  # over all samples of the epoch: fewest and most uses (1 and 1: exact)
    coverage_max: int

    @property
    def rank_samples_per_s(self) -> tuple[float, ...]:
        return tuple(n / s if s > 0 else 0.0 for n, s in zip(self.rank_samples, self.rank_seconds))


class EpochTally:
    def __init__(self, device: torch.device, num_samples: int, prefix: list[int],
                 is_main: bool) -> None:
        self.device, self.num_samples = device, num_samples
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.samples = 0
        self.seen: list[torch.Tensor] = [torch.as_tensor(prefix, dtype=torch.int64)] \
            if is_main and prefix else []
        self.started = time.perf_counter()

    def add(self, loss_sum: torch.Tensor, correct: torch.Tensor, indices: torch.Tensor,
            real: int) -> None:
        self.loss_sum += loss_sum
        self.correct += correct
        self.samples += real
        self.seen.append(indices[:real])

    def partial(self) -> tuple[float, int, int]:
        """(loss sum, real count, correct) of all ranks so far; collective (intra-epoch saves)."""
        sums = self._sums()
        return float(sums[0]), int(sums[2]), int(sums[1])

    def _sums(self) -> torch.Tensor:
        count = torch.tensor(float(self.samples), dtype=torch.float64, device=self.device)
        return dist.all_reduce_sum(torch.stack([self.loss_sum, self.correct.double(), count]))

    def start(self, ended: float | None = None) -> Summing:
        """Begin the epoch's sums (collective; ``Summing.totals()`` waits for them), so that
        they cross the links while the caller does other work (the sync before evaluation).
        `ended`: the `perf_counter()` at which this rank's training ended (its samples/s leave
        out what came after); default now. Three all-reduces, started together: over a slow
        link each collective costs its round trips (four separate ones took ~2 s an epoch at
        150 ms RTT). Per-rank values travel in their rank's slot of a zeroed vector, so summing
        gathers them exactly. Coverage goes as one bit per sample (``train.coverage``)."""
        seconds = (time.perf_counter() if ended is None else ended) - self.started
        rank, world = dist.rank_and_world()
        floats = torch.zeros(3 + world, dtype=torch.float64, device=self.device)
        floats[0], floats[1], floats[2] = self.loss_sum, self.correct.double(), float(self.samples)
        floats[3 + rank] = seconds
        counts = torch.bincount(torch.cat(self.seen) if self.seen else
                                torch.zeros(0, dtype=torch.int64), minlength=self.num_samples)
        seen = coverage.pack(counts)
        ints = torch.zeros(world + 2, dtype=torch.int64)
        ints[rank], ints[world], ints[world + 1] = self.samples, seen.distinct, int(seen.repeated)
        ints, bits = ints.to(self.device), seen.bits.to(self.device)
        return Summing(floats, ints, bits, counts, dist.start_sums(floats, ints, bits))

    def finish(self, ended: float | None = None) -> EpochTotals:
        """``start`` and wait (collective)."""
        return self.start(ended).totals()


@dataclass(frozen=True)
class Summing:
    """An epoch's sums begun by ``EpochTally.start``."""

    floats: torch.Tensor  # loss, correct, count, then each rank's seconds in its slot
    ints: torch.Tensor  # each rank's samples in its slot, then distinct samples, ranks that repeated
    bits: torch.Tensor  # coverage bitmaps, summed
    counts: torch.Tensor  # this rank's uses per sample, for the exact sum if the bits cannot tell
    works: tuple[torch_dist.Work, ...]

    def totals(self) -> EpochTotals:
        """Wait; only an epoch where a sample was used twice sums the exact counts after that."""
        for work in self.works:
            work.wait()
        world = len(self.ints) - 2
        uses = coverage.verdict(self.bits, int(self.ints[world]), int(self.ints[world + 1]), len(self.counts))
        if uses is None:
            exact = self.counts.to(device=self.bits.device, dtype=torch.int32)
            dist.all_reduce_sums(exact)
            uses = int(exact.min()), int(exact.max())
        return EpochTotals(float(self.floats[0]), int(self.floats[1]), int(self.floats[2]),
                           tuple(int(v) for v in self.ints[:world].tolist()),
                           tuple(float(v) for v in self.floats[3:].tolist()), *uses)
