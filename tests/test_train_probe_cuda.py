"""The ``batch_size: auto`` probe as a GPU run meets it: it runs under the training's autocast
dtype, its CUDA memory cap leaves room for what training adds and for other processes, and its
peak does not reach the step records.

No GPU here. Where CUDA is asked, its allocator calls are patched (``mem_get_info``,
``memory_reserved``, ``get_device_properties``, ``reset_peak_memory_stats``,
``max_memory_allocated``, ``synchronize``) and a ``cuda:0`` device is only passed along, never
given a tensor. Autocast is torch's real CPU autocast (bfloat16).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from meshrun.train import balance, perf
from meshrun.train.config import AutoBatchConfig, CommConfig, CommHook, OptimConfig, OptimizerKind, WireDtype

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
MiB = 1 << 20


class Records(nn.Module):
    """The dtype each forward computed in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.seen = nn.Linear(4, 3), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        self.seen.append(out.dtype)
        return out


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 4), torch.randint(0, 3, (n,))


def test_the_probe_runs_under_the_trainings_autocast() -> None:
    """Training runs under ``amp``'s autocast (train/loop.py); the probe timed fp32 before."""
    module = Records()
    balance.probe_throughput(module, _batch, CPU, (2, 4), AutoBatchConfig(probe_steps=1), torch.bfloat16)
    assert module.seen == [torch.bfloat16] * 4
    module.seen.clear()
    balance.probe_throughput(module, _batch, CPU, (2,), AutoBatchConfig(probe_steps=1))
    assert module.seen == [torch.float32] * 2  # amp off, or a CPU rank


def test_what_training_adds_beside_the_probe_in_parameter_sizes() -> None:
    sgd, adamw = OptimConfig(), OptimConfig(name=OptimizerKind.ADAMW)
    plain = OptimConfig(momentum=0.0)
    assert balance.later_copies(sgd, CommConfig(), False) == 1.0  # momentum buffer
    assert balance.later_copies(plain, CommConfig(), False) == 0.0
    assert balance.later_copies(adamw, CommConfig(), False) == 2.0  # exp_avg, exp_avg_sq
    assert balance.later_copies(adamw, CommConfig(), True) == 3.0  # + DDP's buckets
    assert balance.later_copies(sgd, CommConfig(hook=CommHook.POWERSGD), True) == 3.0  # + error feedback
    diloco = CommConfig(hook=CommHook.DILOCO, diloco_outer_momentum=0.9)
    assert balance.later_copies(adamw, diloco, True) == 5.0  # + anchor, outer momentum
    assert balance.later_copies(adamw, CommConfig(hook=CommHook.DILOCO, diloco_outer_momentum=0.0),
                                True) == 4.0
    overlap = CommConfig(hook=CommHook.DILOCO_OVERLAP, diloco_outer_momentum=0.9,
                         diloco_wire_dtype=WireDtype.BF16)
    assert balance.later_copies(adamw, overlap, True) == 6.5  # + pending round, its bf16 head in flight
    hier = CommConfig(hook=CommHook.HIER, diloco_outer_momentum=0.9)
    assert balance.later_copies(adamw, hier, True) == 6.0
    assert balance.later_copies(adamw, overlap, False) == 2.0  # no process group: no DDP, no hook


def test_optimizer_state_already_held_is_not_counted_twice() -> None:
    """A resume loads the optimizer's moments before the probe, whose peak then counts them."""
    module = nn.Linear(10, 10)  # 110 parameters: P = 440 bytes
    optimizer = torch.optim.AdamW(module.parameters())
    adamw = OptimConfig(name=OptimizerKind.ADAMW)
    assert balance.later_bytes(module, optimizer, adamw, CommConfig()) == 880
    module(torch.ones(1, 10)).sum().backward()
    optimizer.step()  # exp_avg and exp_avg_sq now exist
    assert balance.later_bytes(module, optimizer, adamw, CommConfig()) == 0


@pytest.fixture
def gpu_of(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A 24 GiB GPU with ``free`` MiB free and ``cached`` MiB in this process's allocator cache."""
    def make(free: int, cached: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device: SimpleNamespace(total_memory=24576 * MiB))
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free * MiB, 24576 * MiB))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: cached * MiB)
    return make


def test_the_cuda_cap_leaves_room_for_later_state_and_other_processes(gpu_of) -> None:  # noqa: ANN001
    cfg = AutoBatchConfig(cuda_memory_fraction=0.9)
    gpu_of(free=24000, cached=100)  # alone on the card: the fraction of the card bounds it
    alone = balance._MemoryMeter(nn.Linear(4, 3), GPU, cfg, later=1000 * MiB)
    assert alone.limit == int(24576 * MiB * 0.9) - 1000 * MiB  # before: 0.9 of the card, all of it
    gpu_of(free=1700, cached=100)  # another job holds 22.8 GB of it
    shared = balance._MemoryMeter(nn.Linear(4, 3), GPU, cfg, later=1000 * MiB)
    assert shared.limit == 800 * MiB
    assert shared.how == ("CUDA peak allocated vs 1800 MiB (0.9 of 24576 MiB, 1800 MiB free) less "
                          "1000 MiB of optimizer, DDP and outer-hook state")
    gpu_of(free=500, cached=0)
    assert balance._MemoryMeter(nn.Linear(4, 3), GPU, cfg, later=1000 * MiB).limit == 1  # a cap, not 0 (none)


def test_step_records_do_not_carry_the_probes_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The epoch's step window resets the allocator's peak when the epoch's training starts (after
    the probe, which leaves its largest batch's peak behind): the records report the training's."""
    allocator = {"peak": 9000 * MiB}  # the probe's largest batch

    def reset(device: torch.device) -> None:
        assert device == GPU
        allocator["peak"] = 0

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocator["peak"])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    window = perf.StepWindow(GPU, 1)
    allocator["peak"] = max(allocator["peak"], 4000 * MiB)  # the training step's own peak
    window.data_ready()
    window.computed()
    assert window.stepped(8, 16)
    record = window.record(0, "h1", 0, 1)
    assert (record.peak_mem_bytes, record.mem_kind) == (4000 * MiB, "cuda")  # before: 9000 MiB
