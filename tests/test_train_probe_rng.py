"""Both probes (the comm probe, ``train/perf.py``; the ``batch_size: auto`` probe,
``train/balance.py``) put every random generator back as they found it, the GPUs' too.

No GPU here: a fake CUDA generator stands in (``torch.cuda.is_initialized``,
``get_rng_state_all`` and ``set_rng_state_all`` patched), and the model's forward draws from it
as dropout on CUDA draws from the GPU's generator, which ``torch.get_rng_state`` does not cover.
Before the fix a resumed GPU run started from a CUDA stream its checkpoint never held.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from meshrun.train import perf
from meshrun.train.balance import probe_throughput
from meshrun.train.config import AutoBatchConfig
from meshrun.train.loop import StepParts

CPU = torch.device("cpu")


class FakeCudaRng:
    """One GPU's generator state: a counter that the model's forward moves on."""

    def __init__(self) -> None:
        self.state = torch.tensor([7], dtype=torch.uint8)
        self.draws = 0

    def draw(self) -> None:
        self.state = self.state + 1
        self.draws += 1

    def get_all(self) -> list[torch.Tensor]:
        return [self.state.clone()]

    def set_all(self, states: list[torch.Tensor]) -> None:
        self.state = states[0].clone()


class DrawsOnGpu(nn.Module):
    def __init__(self, rng: FakeCudaRng) -> None:
        super().__init__()
        self.rng, self.fc = rng, nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rng.draw()  # dropout on CUDA: the GPU's generator moves on
        return self.fc(torch.nn.functional.dropout(x, 0.5, self.training))  # and the CPU's


@pytest.fixture
def gpu_rng(monkeypatch: pytest.MonkeyPatch) -> FakeCudaRng:
    rng = FakeCudaRng()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", rng.get_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", rng.set_all)
    return rng


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def test_comm_probe_restores_the_gpus_generator(gpu_rng: FakeCudaRng) -> None:
    torch.manual_seed(3)
    module = DrawsOnGpu(gpu_rng)
    parts = StepParts(module, torch.optim.SGD(module.parameters(), lr=0.1), None, None, CPU, 0.0)
    cpu = torch.get_rng_state()
    perf.probe_comm(parts, _batch(8), steps=2)
    assert gpu_rng.draws == 4  # two steps, synced and not: the probe did draw
    assert gpu_rng.state.tolist() == [7]  # before: [11]
    assert torch.equal(torch.get_rng_state(), cpu)


def test_batch_probe_restores_the_gpus_generator(gpu_rng: FakeCudaRng) -> None:
    torch.manual_seed(3)
    module = DrawsOnGpu(gpu_rng)
    cpu = torch.get_rng_state()
    probe_throughput(module, _batch, CPU, (2, 4), AutoBatchConfig(probe_steps=1))
    assert gpu_rng.draws == 4  # two sizes, a warm-up and a timed pass each
    assert gpu_rng.state.tolist() == [7]  # before: [11]
    assert torch.equal(torch.get_rng_state(), cpu)


def test_an_uninitialised_cuda_stays_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU rank on a GPU host: reading every GPU's generator would open a CUDA context (and
    take memory) on each of them."""
    def no(*_: object) -> None:
        raise AssertionError("CUDA touched")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", no)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", no)
    cpu = torch.get_rng_state()
    with perf.kept_rng():
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), cpu)
