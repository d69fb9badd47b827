"""The published test metrics are those of the saved model (train/replicas.py): before evaluating,
every rank takes rank 0's BatchNorm running statistics, the ones the checkpoint holds. Each
rank's last forward updates them from its own batch, so before the fix each rank evaluated its
shard with a model of its own (2 ranks: record 2.1166 vs saved model 2.1157)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from meshrun.train.checkpoint import checkpoint_name, load_file
from meshrun.train.config import CONFIG_DIR, load_config
from meshrun.train.data import build_datasets
from meshrun.train.loop import evaluate
from meshrun.train.models import build_model
from tests.trainer.harness import records, train

# PointNet++ (BatchNorm in its set-abstraction MLPs and head), small enough for seconds of CPU:
# 96 clouds, 2 ranks x 16 = 3 steps.
TINY = ("data.train_size=96", "data.test_size=64", "data.num_points=64", "model.sa_points=[16,8]",
        "model.sa_samples=8", "model.width=8", "data.batch_size=16", "data.eval_batch_size=16",
        "epochs=1", "log.tensorboard=false", "perf.comm_probe_steps=0")


def evaluate_saved(run: Path, step: int) -> tuple[float, float, dict[str, torch.Tensor]]:
    """The checkpoint's model in this one process, on the whole test set: (loss, top-1, state)."""
    cfg = load_config(CONFIG_DIR / "pointnet2_shapes.yaml", TINY)
    data = build_datasets(cfg.data)
    model = build_model(cfg.model, data.num_classes, data.input_shape)
    saved = load_file(run / "checkpoints" / checkpoint_name(step))["model"]
    model.load_state_dict(saved)
    got = evaluate(model, DataLoader(data.test, batch_size=cfg.data.eval_batch_size),
                   torch.device("cpu"), None, sum_over_ranks=lambda t: t)
    return got.loss, got.top1, saved


@pytest.mark.slow
def test_epoch_record_is_the_saved_models_evaluation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = train(run, *TINY, config=CONFIG_DIR / "pointnet2_shapes.yaml")
    assert proc.returncode == 0, proc.stderr
    [epoch] = records(run, kind="epoch")
    loss, top1, saved = evaluate_saved(run, epoch["global_step"])
    # Running statistics moved in training (so this checks something): not the initial 0 and 1.
    assert any(k.endswith("running_var") and not torch.equal(v, torch.ones_like(v))
               for k, v in saved.items())
    # Same model, same samples; only the sums' grouping differs (shards of 2 ranks vs one).
    assert epoch["test_loss"] == pytest.approx(loss, rel=1e-6, abs=0.0)
    assert epoch["test_acc"] == pytest.approx(top1, abs=1e-9)
