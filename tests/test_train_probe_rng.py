"""Both probes (the comm probe, ``train/perf.py``; the ``batch_size: auto`` probe,
``train/balance.py``) put every random generator back as they found it, the GPUs' too.

No GPU here: a fake CUDA generator stands in (``torch.cuda.is_initialized``,
``get_rng_state_all`` and ``set_rng_state_all`` patched), and the model's forward draws from it
as dropout on CUDA draws from the GPU's generator, which ``torch.get_rng_state`` does not cover.
Before the fix a resumed GPU run started from a CUDA stream its checkpoint never held.

The comm probe's batch is built under the same guard: its augmentation draws (shapes, CIFAR)
came from the training's stream, so a resume (which restores each rank's RNG, then probes) was
shifted from the uninterrupted run (PointNet++ on augmented shapes: weights 0.022 apart), and
the model depended on ``perf.comm_probe_steps``, a timing knob.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn

from meshrun.train import perf
from meshrun.train.balance import probe_throughput
from meshrun.train.checkpoint import checkpoint_name, load_file
from meshrun.train.config import CONFIG_DIR, AutoBatchConfig, load_config
from meshrun.train.loop import StepParts
from tests.trainer.harness import fork_ranks, records, train

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


# PointNet++ on generated shapes, augmented (random rotation and scale from torch's global RNG).
SHAPES = CONFIG_DIR / "pointnet2_shapes.yaml"
TINY = ("data.train_size=96", "data.test_size=32", "data.num_points=64", "model.sa_points=[16,8]",
        "model.sa_samples=8", "model.width=8", "data.batch_size=16", "log.tensorboard=false")


def _comm_probe_rank(rank: int, world: int, port: int, out: str) -> None:
    from meshrun.train import trainer
    from meshrun.train.dist import DistEnv
    from meshrun.train.render import make_console

    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    cfg = load_config(SHAPES, (*TINY, "perf.comm_probe_steps=1"))
    env = DistEnv(launched=True, rank=rank, world_size=world, host="h1")
    run = Path(out) / f"run{rank}"
    built = trainer.Trainer(cfg, env, run, CPU, make_console(False, 1))
    before = torch.get_rng_state()
    built._probe_comm()
    kept = torch.equal(torch.get_rng_state(), before)
    built.close()
    probed = len(records(run, f"metrics.rank{rank}.jsonl", kind="comm"))
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"probed": probed, "rng_kept": kept}))
    torch_dist.destroy_process_group()


def test_comm_probe_batch_leaves_the_training_stream_as_found(tmp_path: Path) -> None:
    fork_ranks(_comm_probe_rank, 2, str(tmp_path))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"probed": 1, "rng_kept": True}, rank


@pytest.mark.slow
def test_resume_with_augmentation_is_bit_identical(tmp_path: Path) -> None:
    """Stopped at step 4 of 6 (96 clouds, 2 ranks x 16, 2 epochs) and resumed on the same 2
    processes: the same final weights, bit for bit, as the uninterrupted run."""
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    common = (*TINY, "epochs=2", "checkpoint.every_steps=2")
    assert train(straight, *common, config=SHAPES).returncode == 0
    stopped = train(broken, *common, "debug.stop_after_step=4", config=SHAPES)
    assert stopped.returncode != 0 and "debug.stop_after_step=4" in stopped.stderr
    resumed = train(broken, *common, config=SHAPES)
    assert resumed.returncode == 0, resumed.stderr
    assert records(broken, kind="resume")[0]["from_step"] == 4
    a, b = (load_file(run / "checkpoints" / checkpoint_name(6))["model"] for run in (straight, broken))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
