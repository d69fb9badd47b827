"""Exact distributed evaluation: every test sample counted once, whatever the world size."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from meshrun.train.loop import evaluate
from meshrun.train.sampler import eval_shard
from tests.trainer.harness import fork_ranks

N_SAMPLES, N_CLASSES = 11, 7  # 11 over 3 ranks: DistributedSampler would pad to 12


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(N_SAMPLES, N_CLASSES, generator=gen),
                         torch.randint(0, N_CLASSES, (N_SAMPLES,), generator=gen))


def _worker(rank: int, world: int, port: int, out: Path) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                  rank=rank, world_size=world)
    try:
        shard = Subset(dataset(), eval_shard(N_SAMPLES, world, rank))
        result = evaluate(nn.Identity(), DataLoader(shard, batch_size=2), torch.device("cpu"), None)
        (out / f"rank{rank}.json").write_text(json.dumps(result.__dict__))
    finally:
        torch_dist.destroy_process_group()


def test_three_ranks_match_single_process_exactly(tmp_path: Path) -> None:
    fork_ranks(_worker, 3, tmp_path)
    x, y = dataset().tensors  # logits are the inputs themselves (identity model)
    expected_top1 = (x.argmax(1) == y).sum().item() / N_SAMPLES
    expected_top5 = (x.topk(5, 1).indices == y[:, None]).any(1).sum().item() / N_SAMPLES
    expected_loss = nn.functional.cross_entropy(x.double(), y).item()
    for rank in range(3):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["count"] == N_SAMPLES
        assert got["top1"] == expected_top1 and got["top5"] == expected_top5
        assert abs(got["loss"] - expected_loss) < 1e-6
    assert 0 < expected_top1 < expected_top5 < 1  # the data exercises both metrics
