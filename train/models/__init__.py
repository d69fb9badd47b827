"""Models: single-device ``nn.Module``s; DDP wrapping happens in ``train.trainer``.

Contract: ``build_model(cfg, num_classes, input_shape)`` returns an untrained module whose
``forward`` maps a batch of samples of ``input_shape`` to ``(batch, num_classes)`` logits.
"""

from __future__ import annotations

import importlib
from typing import Callable

from torch import nn

from meshrun.train.config import ModelConfig, ModelKind


def build_model(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    # Only the named model's module is imported (vision pulls in torchvision; see train.data).
    module = importlib.import_module(f"meshrun.train.models.{_MODULES[cfg.name]}")
    builder: Callable[[ModelConfig, int, tuple[int, ...]], nn.Module] = module.build
    return builder(cfg, num_classes, input_shape)


_MODULES = {ModelKind.MLP: "mlp", ModelKind.TOY: "toy", ModelKind.TORCHVISION: "vision",
            ModelKind.POINTNET2: "pointnet2"}
