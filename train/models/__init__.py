"""Models: single-device ``nn.Module``s; DDP wrapping happens in ``train.trainer``.

Contract: ``build_model(cfg, num_classes, input_shape)`` returns an untrained module whose
``forward`` maps a batch of samples of ``input_shape`` to ``(batch, num_classes)`` logits.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from meshrun.train.config import ModelConfig, ModelKind


def build_model(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return _builders()[cfg.name](cfg, num_classes, input_shape)


def _builders() -> dict[ModelKind, Callable[[ModelConfig, int, tuple[int, ...]], nn.Module]]:
    from meshrun.train.models import mlp, pointnet2, toy, vision

    return {ModelKind.MLP: mlp.build, ModelKind.TOY: toy.build,
            ModelKind.TORCHVISION: vision.build, ModelKind.POINTNET2: pointnet2.build}
