"""Any ``torchvision.models`` classifier by name, with ``num_classes`` and a small-image stem."""

from __future__ import annotations

import difflib

import torchvision
from torch import nn

from meshrun.train.config import ModelConfig
from meshrun.train.errors import UsageError


def build(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    names = torchvision.models.list_models(module=torchvision.models)
    if cfg.arch not in names:
        guess = difflib.get_close_matches(cfg.arch, names, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise UsageError(f"model.arch={cfg.arch!r} is not a torchvision classification model"
                         f"{hint}; see torchvision.models.list_models()")
    if len(input_shape) != 3:
        raise UsageError(f"model.arch={cfg.arch} needs images, but the dataset gives samples "
                         f"of shape {input_shape}")
    model = torchvision.models.get_model(cfg.arch, weights=None, num_classes=num_classes)
    if cfg.small_stem:
        _small_stem(model, cfg.arch, input_shape[0])
    return model


def _small_stem(model: nn.Module, arch: str, in_channels: int) -> None:
    """CIFAR-style stem: a 3x3 stride-1 first conv and no max-pool, so 32x32 inputs are not
    shrunk to 8x8 before the first residual stage."""
    conv1 = getattr(model, "conv1", None)
    if not isinstance(conv1, nn.Conv2d) or not hasattr(model, "maxpool"):
        raise UsageError(f"model.small_stem=true works with ResNet-style models (conv1 + "
                         f"maxpool); {arch} has no such stem")
    model.conv1 = nn.Conv2d(in_channels, conv1.out_channels, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
