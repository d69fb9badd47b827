"""A rank whose GPU runs out of memory ends with one line on stderr and exit status 4, no traceback.

The GPU is mocked: there is none here, so each test raises torch's own out-of-memory error
(``torch.OutOfMemoryError``, the class CUDA's allocator raises) on CPU. The mocked-GPU tests
replace the device with ``cuda:0``, the trainer with a stub whose ``fit`` raises, and
``torch.cuda.mem_get_info`` with fixed figures; the real-trainer tests run ``main`` in-process
(no torchrun: no process group) on CPU with a model that raises the error in a training step or
in evaluation. Either way the teardown (``Trainer.close``, ``dist.shutdown``) must still run.

The line then reaches the controller as one of the host's ``[host:rank]`` lines, which
deploy/render/console.py's ``failure_tail`` prints among the failing host's ``worker_tail``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from meshrun.train import dist, trainer as trainer_module
from meshrun.train.__main__ import EXIT_OOM, main
from meshrun.train.balance import BatchPlan, BatchSource
from meshrun.train.errors import GIB, OomPhase, OomSite, oom_message

TORCH_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "MESHRUN_RUN_ID",
               "MESHRUN_BATCH_SIZE", "MESHRUN_SITE", "MESHRUN_HOST")
CONFIG_FIX = ("lower data.batch_size (halving it and doubling optim.accum_steps, now 1, keeps the samples "
              "per optimizer step), or set batch_size: auto for host alpha in the inventory to size it to "
              "the GPU")
SITE = OomSite(rank=3, host="gpu2", device="cuda:1", phase=OomPhase.TRAIN, batch_size=64, source="config",
               accum_steps=2, eval_batch_size=256, memory_fraction=0.9,
               memory=(int(7.5 * GIB), 8 * GIB))


# -- the line, planned ---------------------------------------------------------------------

@pytest.mark.parametrize("change, line", [
    ({}, "rank 3 (host gpu2, cuda:1): CUDA out of memory at data.batch_size=64 (7.5 of 8.0 GiB in use); "
         "lower data.batch_size (halving it and doubling optim.accum_steps, now 2, keeps the samples per "
         "optimizer step), or set batch_size: auto for host gpu2 in the inventory to size it to the GPU"),
    ({"source": "inventory", "memory": None},
     "rank 3 (host gpu2, cuda:1): CUDA out of memory at batch_size=64 (host gpu2's inventory); lower "
     "batch_size for host gpu2 in the inventory, or set it to auto to size it to the GPU"),
    ({"source": "auto", "memory_fraction": 0.85},
     "rank 3 (host gpu2, cuda:1): CUDA out of memory at batch_size=64 (chosen by batch_size: auto) "
     "(7.5 of 8.0 GiB in use); lower autobatch.cuda_memory_fraction (now 0.85) so the probe sizes this "
     "rank lower, or give host gpu2 a fixed batch_size in the inventory"),
    ({"batch_size": 1},
     "rank 3 (host gpu2, cuda:1): CUDA out of memory at data.batch_size=1 (7.5 of 8.0 GiB in use); even "
     "one sample does not fit: choose a smaller model (model.*) or amp=bf16"),
    ({"phase": OomPhase.EVAL},
     "rank 3 (host gpu2, cuda:1): CUDA out of memory in evaluation at data.eval_batch_size=256 (7.5 of "
     "8.0 GiB in use); lower data.eval_batch_size (the test metrics do not depend on it)"),
    ({"phase": OomPhase.SETUP},
     "rank 3 (host gpu2, cuda:1): CUDA out of memory before training began (model, optimizer state, "
     "checkpoint) (7.5 of 8.0 GiB in use); the model does not fit beside what else holds this GPU: free "
     "the GPU (nvidia-smi lists its processes) or choose a smaller model (model.*)"),
], ids=["config", "inventory", "auto", "one-sample", "eval", "setup"])
def test_the_line_names_the_option_that_set_the_size(change: dict, line: str) -> None:
    assert oom_message(dataclasses.replace(SITE, **change)) == line


# -- main, GPU mocked: a stub trainer on "cuda:0" -------------------------------------------

@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process as on host alpha, without torchrun (no process group)."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MESHRUN_HOST", "alpha")


@pytest.fixture
def teardown(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the teardown ran, in order (``dist.shutdown`` still runs for real)."""
    calls: list[str] = []
    shutdown = dist.shutdown

    def recorded() -> None:
        # The line must be out before the teardown, which on NCCL may wait on the peers.
        calls.append("shutdown" if "out of memory" in _stderr_so_far() else "shutdown before the line")
        shutdown()
    monkeypatch.setattr(dist, "shutdown", recorded)
    return calls


def _stderr_so_far() -> str:
    """What capsys's stderr holds so far (its CaptureIO keeps every write)."""
    import sys
    return sys.stderr.getvalue()


class StubTrainer:
    """Stands in for the trainer on a GPU this machine does not have: ``fit`` runs out."""

    def __init__(self, *built: object, calls: list[str], source: BatchSource) -> None:
        self.calls = calls  # ``built``: Trainer's arguments (config, env, run dir, device, console)
        self.batches = BatchPlan((48,), ("alpha",), (source,), (None,))

    def fit(self) -> None:
        raise torch.OutOfMemoryError(TORCH_OOM)

    def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize("source, env_batch, shown, fix", [
    (BatchSource.CONFIG, None, "data.batch_size=48", CONFIG_FIX),
    (BatchSource.INVENTORY, "48", "batch_size=48 (host alpha's inventory)",
     "lower batch_size for host alpha in the inventory, or set it to auto to size it to the GPU"),
], ids=["config", "inventory"])
def test_mocked_gpu_out_of_memory_is_one_line_and_status_4(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        host_env: None, teardown: list[str], source: BatchSource, env_batch: str | None, shown: str,
        fix: str) -> None:
    if env_batch:
        monkeypatch.setenv("MESHRUN_BATCH_SIZE", env_batch)
    monkeypatch.setattr(dist, "pick_device", lambda env, backend: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (GIB // 2, 8 * GIB))
    monkeypatch.setattr(trainer_module, "Trainer",
                        lambda *a: StubTrainer(*a, calls=teardown, source=source))
    assert main(["--run-dir", str(tmp_path / "run"), "data.batch_size=48"]) == EXIT_OOM == 4
    assert capsys.readouterr().err.splitlines() == [
        f"train: error: rank 0 (host alpha, cuda:0): CUDA out of memory at {shown} (7.5 of 8.0 GiB in "
        f"use); {fix}"]
    assert teardown == ["close", "shutdown"]


def test_mocked_gpu_whose_memory_query_fails_still_gets_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        host_env: None, teardown: list[str]) -> None:
    """CUDA may not answer after the error: the figures go, the line stays."""
    def broken(device: object = None) -> tuple[int, int]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(dist, "pick_device", lambda env, backend: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    monkeypatch.setattr(trainer_module, "Trainer",
                        lambda *a: StubTrainer(*a, calls=teardown, source=BatchSource.CONFIG))
    assert main(["--run-dir", str(tmp_path / "run"), "data.batch_size=48"]) == EXIT_OOM
    assert capsys.readouterr().err.splitlines() == [
        f"train: error: rank 0 (host alpha, cuda:0): CUDA out of memory at data.batch_size=48; {CONFIG_FIX}"]
    assert teardown == ["close", "shutdown"]


def test_mocked_gpu_out_of_memory_while_building_the_trainer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        host_env: None, teardown: list[str]) -> None:
    def runs_out(*args: object) -> None:
        raise torch.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(dist, "pick_device", lambda env, backend: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (GIB, 8 * GIB))
    monkeypatch.setattr(trainer_module, "Trainer", runs_out)
    assert main(["--run-dir", str(tmp_path / "run")]) == EXIT_OOM
    assert capsys.readouterr().err.splitlines() == [
        "train: error: rank 0 (host alpha, cuda:0): CUDA out of memory before training began (model, "
        "optimizer state, checkpoint) (7.0 of 8.0 GiB in use); the model does not fit beside what else "
        "holds this GPU: free the GPU (nvidia-smi lists its processes) or choose a smaller model (model.*)"]
    assert teardown == ["shutdown"]


# -- main, the real trainer on CPU, its model raising the error -----------------------------

class RunsOut(nn.Module):
    """The digits model, raising torch's out-of-memory error in training or in evaluation."""

    def __init__(self, inner: nn.Module, in_training: bool) -> None:
        super().__init__()
        self.inner, self.in_training = inner, in_training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training == self.in_training:
            raise torch.OutOfMemoryError(TORCH_OOM)
        return self.inner(x)


@pytest.mark.parametrize("in_training, line", [
    (True, f"train: error: rank 0 (host alpha, cpu): CPU out of memory at data.batch_size=32; {CONFIG_FIX}"),
    (False, "train: error: rank 0 (host alpha, cpu): CPU out of memory in evaluation at "
            "data.eval_batch_size=256; lower data.eval_batch_size (the test metrics do not depend on it)"),
], ids=["train-step", "evaluation"])
def test_real_trainer_out_of_memory_is_one_line_and_status_4(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        host_env: None, teardown: list[str], in_training: bool, line: str) -> None:
    build = trainer_module.build_model
    monkeypatch.setattr(trainer_module, "build_model", lambda *a: RunsOut(build(*a), in_training))
    close = trainer_module.Trainer.close
    monkeypatch.setattr(trainer_module.Trainer, "close",
                        lambda self: (teardown.append("close"), close(self))[-1])
    assert main(["--run-dir", str(tmp_path / "run"), "epochs=1"]) == EXIT_OOM
    err = capsys.readouterr().err
    assert err.splitlines() == [line]
    assert "Traceback" not in err
    assert teardown == ["close", "shutdown"]
