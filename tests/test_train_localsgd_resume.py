"""Local SGD (train/comm.py) in checkpoints: every rank's optimizer state, back to its own rank.

Between averages each rank steps on its own gradients, so the SGD momentum buffers differ per
rank. Before the fix only the writer's (rank 0's) optimizer was saved and every rank resumed with
it: a run stopped and resumed on the same 2 processes ended 0.021 away from the uninterrupted one
(and on one host not even the checkpoint layer's divergence warning showed it). The pattern of
tests/test_train_comm.py's PowerSGD resume, on the real trainer in forked gloo ranks (CPU): a
torchrun per run would cost seconds of imports each.
"""

from __future__ import annotations

import datetime
import io
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from meshrun.train.checkpoint import checkpoint_name, load_file
from tests.trainer.harness import fork_ranks, records

CPU = torch.device("cpu")
# digits: 1438 training samples, 2 ranks x 32 = 23 steps per epoch; step 10 is mid-epoch, between
# two averages (start_iter 3, period 4: averages at steps 4, 8, 12, ...).
LOCALSGD = ("epochs=1", "checkpoint.every_steps=5", "log.tensorboard=false", "comm.hook=localsgd",
            "comm.start_iter=3", "comm.localsgd_period=4", "perf.comm_probe_steps=0")
STOP, FINAL_STEP = 10, 23


def _rank(rank: int, world: int, port: int, run: str, *overrides: str) -> None:
    """One start of the trainer on this rank; rank 0's console lines in ``<run>.out``."""
    from meshrun.train import trainer
    from meshrun.train.config import load_config
    from meshrun.train.dist import DistEnv
    from meshrun.train.errors import InjectedFailure
    from meshrun.train.render import PlainConsole

    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world, timeout=datetime.timedelta(seconds=60))
    said = io.StringIO()
    env = DistEnv(launched=True, rank=rank, world_size=world, host="h1")
    built = trainer.Trainer(load_config(None, (*LOCALSGD, *overrides)), env, Path(run), CPU,
                            PlainConsole(1000, said, enabled=rank == 0))
    try:
        built.fit()
    except InjectedFailure:  # debug.stop_after_step: stopped right after that checkpoint
        pass
    built.close()
    if rank == 0:
        Path(f"{run}.out").write_text(said.getvalue())
    torch_dist.destroy_process_group()


def _start(run: Path, *overrides: str, nproc: int = 2) -> str:
    fork_ranks(_rank, nproc, str(run), *overrides)
    return Path(f"{run}.out").read_text()


@pytest.mark.slow
def test_localsgd_resumes_each_ranks_optimizer_exactly_and_rank0s_on_a_new_world_size(
        tmp_path: Path) -> None:
    """One run stopped at step 10, resumed from two copies of it: on the same 2 ranks (bit for bit
    the uninterrupted run) and on 3 (every rank starts from rank 0's optimizer, and trains on)."""
    straight, broken, wider = tmp_path / "straight", tmp_path / "broken", tmp_path / "wider"
    _start(straight)
    _start(broken, f"debug.stop_after_step={STOP}")
    shutil.copytree(broken, wider)

    saved = load_file(broken / "checkpoints" / checkpoint_name(STOP))
    ranks = saved["comm"]["ranks"]
    # torch's hook counts only its warm-up steps (start_iter 3); the averager every step.
    assert [(r["localsgd_iter"], r["averager_step"]) for r in ranks] == [(3, STOP)] * 2
    momentum = [r["optimizer"]["state"][0]["momentum_buffer"] for r in ranks]
    assert not torch.equal(momentum[0], momentum[1])  # why each rank's is gathered
    assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum[0])  # top: rank 0's

    said = _start(broken)
    assert "comm: localsgd hook state restored from the checkpoint" in said
    a, b = (load_file(run / "checkpoints" / checkpoint_name(FINAL_STEP))["model"] for run in (straight, broken))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []  # before: every parameter apart
    assert records(straight, kind="epoch")[-1]["test_loss"] == records(broken, kind="epoch")[-1]["test_loss"]

    said = _start(wider, nproc=3)
    assert ("comm: world size changed (2 -> 3): localsgd hook state reset (its warm-up starts over; "
            "every rank continues from rank 0's optimizer state)") in said
    assert records(wider, kind="epoch")[-1]["world_size"] == 3
    assert load_file(wider / "checkpoints" / "best.pt")["comm"]["world_size"] == 3
