"""Uneven per-rank batches give exactly the global-batch update (3 gloo processes, float64).

The ranks run the trainer's own pieces: ``plan_steps`` lays out the epoch with per-rank batch
sizes, ``micro_steps`` gives each micro-step its loss scale, ``forward_backward`` and
``optimizer_step`` do the DDP step. The reference is one process taking one SGD step on the
mean loss of all the samples of that optimizer step, concatenated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from meshrun.train.loop import StepParts, forward_backward, micro_steps, optimizer_step
from meshrun.train.sampler import plan_steps
from tests.trainer.harness import fork_ranks

IN, HIDDEN, CLASSES, LR = 5, 7, 3, 0.5


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES)).double()


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(n, IN, generator=gen, dtype=torch.float64),
            torch.randint(0, CLASSES, (n,), generator=gen))


def first_window(sizes: tuple[int, ...], accum: int, n: int) -> list[int]:
    """Indices (all ranks) of the first optimizer step, in the order the sampler lays them out."""
    steps = plan_steps(list(range(n)), 0, sizes)[:accum]
    return [i for s in steps for b in s.per_rank for i in b.indices[:b.real]]


def _worker(rank: int, world: int, port: int, out: Path, sizes: tuple[int, ...], accum: int,
            n: int, naive: bool) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    try:
        module = model()
        ddp = DistributedDataParallel(module)
        opt = torch.optim.SGD(module.parameters(), lr=LR)
        parts = StepParts(ddp, opt, None, None, torch.device("cpu"), 0.0)
        x, y = data(n)
        steps = plan_steps(list(range(n)), 0, sizes)
        for step, m in zip(steps, micro_steps(steps, rank, accum)):
            idx = list(step.per_rank[rank].indices)
            scale = 1.0 / max(m.real, 1) if naive else m.scale  # naive: average of rank means
            forward_backward(parts, x[idx], y[idx], m.real, scale, m.sync)
            if m.sync:
                optimizer_step(parts)
                break
        torch.save(module.state_dict(), out / f"rank{rank}.pt")
    finally:
        torch_dist.destroy_process_group()


def reference(sizes: tuple[int, ...], accum: int, n: int) -> dict[str, torch.Tensor]:
    module = model()
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    x, y = data(n)
    idx = first_window(sizes, accum, n)
    nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
    opt.step()
    return module.state_dict()


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


CASES = {
    "8/16/40": ((8, 16, 40), 1, 64),
    "8/16/40 accum 2": ((8, 16, 40), 2, 128),
    "8/16/40 accum 3, short last window 64+37": ((8, 16, 40), 3, 101),
    "8/16/40 on 2 samples: rank 0 only pads": ((8, 16, 40), 1, 2),
    "elastic: 2 ranks 24/40": ((24, 40), 1, 64),
}


@pytest.mark.parametrize("sizes, accum, n", CASES.values(), ids=CASES.keys())
def test_uneven_batches_equal_one_process_on_the_global_batch(
        tmp_path: Path, sizes: tuple[int, ...], accum: int, n: int) -> None:
    fork_ranks(_worker, len(sizes), tmp_path, sizes, accum, n, False)
    expected = reference(sizes, accum, n)
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_diff(got, expected) <= 1e-9
    assert len(first_window(sizes, accum, n)) == min(n, accum * sum(sizes))


def test_averaging_rank_means_is_detectably_wrong(tmp_path: Path) -> None:
    """The check above is sensitive: DDP's plain average of per-rank means misses by far."""
    sizes, accum, n = (8, 16, 40), 1, 64
    fork_ranks(_worker, 3, tmp_path, sizes, accum, n, True)
    assert max_diff(torch.load(tmp_path / "rank0.pt"), reference(sizes, accum, n)) > 1e-4
