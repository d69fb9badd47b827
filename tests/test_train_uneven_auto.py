"""`batch_size: auto`: the probe, its sizes in the run, and resume onto another batch layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

import pytest

from meshrun.train.balance import probe_throughput
from meshrun.train.config import AutoBatchConfig
from meshrun.train.dist import read_env
from meshrun.train.errors import UsageError
from meshrun.train.sampler import plan_steps
from tests.trainer.harness import records, train

DIGITS_TRAIN = 1438
AUTO = {"MESHRUN_BATCH_SIZE": "auto"}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(256, 10))


def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 64), torch.randint(0, 10, (size,))


def test_controller_batch_size_env_is_parsed_once() -> None:
    assert (read_env({"MESHRUN_BATCH_SIZE": "auto"}).batch_auto,
            read_env({"MESHRUN_BATCH_SIZE": "auto"}).batch_size) == (True, None)
    assert (read_env({"MESHRUN_BATCH_SIZE": "48"}).batch_auto,
            read_env({"MESHRUN_BATCH_SIZE": "48"}).batch_size) == (False, 48)
    assert read_env({}).batch_size is None and not read_env({}).batch_auto
    with pytest.raises(UsageError, match="MESHRUN_BATCH_SIZE='0' must be >= 1 or 'auto'"):
        read_env({"MESHRUN_BATCH_SIZE": "0"})
    with pytest.raises(UsageError, match="MESHRUN_BATCH_SIZE='big' must be an integer"):
        read_env({"MESHRUN_BATCH_SIZE": "big"})


def test_probe_measures_caps_and_leaves_the_model_as_found() -> None:
    module = mlp()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    free = probe_throughput(module, batch, torch.device("cpu"), (8, 16, 32), AutoBatchConfig())
    assert free.sizes == (8, 16, 32) and len(free.seconds) == 3 and free.samples_per_s > 0
    assert free.max_batch == 0 and free.memory == "no CPU cap configured"
    # Per sample: about 4 saved activations of 256 floats (4 KiB); parameters ~70 K floats.
    capped = probe_throughput(module, batch, torch.device("cpu"), (8, 16, 32, 4096),
                              AutoBatchConfig(cpu_memory_mb=1.5))
    assert 16 < capped.max_batch < 4096 and capped.sizes == (8, 16, 32)  # 4096 predicted too big
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_auto_sizes_are_valid_logged_and_used(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = train(run, "epochs=2", "data.global_batch_size=96", "log.tensorboard=false", env=AUTO)
    assert proc.returncode == 0, proc.stderr
    balance = records(run, kind="balance")[0]
    sizes = balance["batch_sizes"]
    assert sum(sizes) == 96 and min(sizes) >= 1 and balance["sources"] == ["auto", "auto"]
    assert all(p["samples_per_s"] > 0 and p["sizes"] == [24, 48, 96] for p in balance["probes"])
    assert f"batch sizes (auto, global 96): local/r0 {sizes[0]} (probe " in proc.stdout
    steps = plan_steps(list(range(DIGITS_TRAIN)), 0, sizes)
    for epoch in records(run, kind="epoch"):
        assert epoch["batch_sizes"] == sizes  # the probe's result is what the sampler used
        assert epoch["rank_samples"] == [sum(s.per_rank[r].real for s in steps) for r in (0, 1)]
        assert (epoch["coverage_min"], epoch["coverage_max"]) == (1, 1)
    result = json.loads((run / "result.json").read_text())
    assert result["batch_sizes"] == sizes and result["batch_source"] == "auto"
    assert result["global_batch_size"] == 96 and set(result["samples_per_s"]) == {"local"}
    assert len(result["rank_samples_per_s"]) == 2 and min(result["rank_samples_per_s"]) > 0


def test_resume_onto_another_layout_uses_each_sample_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = ("epochs=1", "checkpoint.every_steps=5", "log.tensorboard=false")
    stopped = train(run, *common, "data.global_batch_size=96", "debug.stop_after_step=5", env=AUTO)
    assert stopped.returncode != 0 and "debug.stop_after_step=5" in stopped.stderr
    resumed = train(run, *common, "data.batch_size=20", nproc=0)  # 1 process, config batch
    assert resumed.returncode == 0, resumed.stderr
    epoch = records(run, kind="epoch")[-1]
    assert epoch["consumed_before"] == 5 * 96 and epoch["batch_sizes"] == [20]
    assert epoch["rank_samples"] == [DIGITS_TRAIN - 480]
    assert (epoch["coverage_min"], epoch["coverage_max"]) == (1, 1)
    assert epoch["samples_seen"] == DIGITS_TRAIN


def test_sync_bn_on_cpu_is_a_one_line_usage_error(tmp_path: Path) -> None:
    proc = train(tmp_path / "run", "epochs=1", "sync_bn=true", "log.tensorboard=false")
    assert proc.returncode != 0  # the launcher (as torchrun) reports its child's exit 2 as 1
    assert "train: error: sync_bn=true needs CUDA" in proc.stderr
