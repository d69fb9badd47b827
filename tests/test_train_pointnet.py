"""PointNet++ on generated shapes with the shipped config (about 2.2 CPU-minutes on 2 processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshrun.train.config import CONFIG_DIR
from tests.trainer.harness import train


@pytest.mark.slow
def test_pointnet2_shapes_reaches_90_percent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = train(run, "log.tensorboard=false", config=CONFIG_DIR / "pointnet2_shapes.yaml", torchrun=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["metrics"]["test_acc"] >= 0.90, result
