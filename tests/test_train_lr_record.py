"""The LR an optimizer step runs at (train/optim.py ``step_lr``) and the one an epoch record
reports: a step decay at an epoch boundary applies from the next epoch's first step. Before, each
step took the schedule at its *end*, so the last step of an epoch already ran at the next
segment's LR and the epoch record said so (ImageNet, LR/10 every 30 epochs: 2502 of epoch 30's
2503 steps at 0.1, recorded as 0.01)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshrun.train.config import ScheduleConfig, ScheduleKind, load_config
from meshrun.train.dist import DistEnv
from meshrun.train.optim import step_lr
from meshrun.train.render import make_console
from tests.trainer.harness import records

STEP = ScheduleConfig(name=ScheduleKind.STEP, step_epochs=1, gamma=0.1)


def test_a_step_runs_at_the_schedule_where_it_begins() -> None:
    assert step_lr(STEP, 0.1, 0.9, 1.0, 3) == 0.1  # the epoch's last step: still epoch 1's LR
    assert step_lr(STEP, 0.1, 1.0, 1.1, 3) == pytest.approx(0.01)  # the next epoch's first
    cosine = ScheduleConfig(name=ScheduleKind.COSINE)
    assert step_lr(cosine, 0.1, 0.0, 0.5, 2) == 0.1  # the run's first step: the full LR
    assert step_lr(cosine, 0.1, 1.0, 1.5, 2) == pytest.approx(0.05)  # half way
    assert step_lr(cosine, 0.1, 1.5, 2.0, 2) == pytest.approx(0.05 * (1 - 2 ** -0.5))


def test_warmup_reads_the_ramp_where_the_step_ends() -> None:
    """Read at its start, a run's first step would train at LR 0."""
    warm = ScheduleConfig(name=ScheduleKind.COSINE, warmup_epochs=1.0)
    assert step_lr(warm, 0.1, 0.0, 0.25, 3) == pytest.approx(0.025)
    assert step_lr(warm, 0.1, 0.75, 1.25, 3) == 0.1  # straddles the end: the ramp's top
    assert step_lr(warm, 0.1, 1.0, 1.5, 3) == 0.1  # the cosine's start


def test_an_epoch_trains_and_is_recorded_at_its_own_lr(tmp_path: Path) -> None:
    """One process, digits (45 steps an epoch), LR/10 after every epoch: each step's LR as the
    optimizer saw it, and the epoch records'."""
    from meshrun.train.trainer import Trainer

    cfg = load_config(None, ("epochs=2", "schedule.name=step", "schedule.step_epochs=1",
                             "schedule.gamma=0.1", "schedule.warmup_epochs=0", "optim.lr=0.05",
                             "log.tensorboard=false"))
    trainer = Trainer(cfg, DistEnv(launched=False), tmp_path / "run", torch.device("cpu"),
                      make_console(False, 1))
    used: list[float] = []
    trainer.parts.optimizer.register_step_pre_hook(
        lambda opt, *_: used.append(opt.param_groups[0]["lr"]))
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert len(used) == 90
    assert used[:45] == [0.05] * 45 and used[45:] == [pytest.approx(0.005)] * 45
    epochs = records(tmp_path / "run", kind="epoch")
    assert [e["lr"] for e in epochs] == [0.05, pytest.approx(0.005)]
