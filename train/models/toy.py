"""Seed 000's ToyModel: a LeNet-style CNN for 3x32x32 images (CIFAR-10)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshrun.train.config import ModelConfig
from meshrun.train.errors import UsageError


class ToyModel(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def build(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    if tuple(input_shape) != (3, 32, 32):
        raise UsageError(f"model.name=toy needs 3x32x32 images, but the dataset gives "
                         f"{'x'.join(map(str, input_shape))}; use data.image_size=32")
    return ToyModel(num_classes)
