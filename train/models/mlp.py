"""A plain multi-layer perceptron over flattened inputs."""

from __future__ import annotations

import math

from torch import nn

from meshrun.train.config import ModelConfig


def build(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in cfg.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if cfg.dropout > 0:
            layers.append(nn.Dropout(cfg.dropout))
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
