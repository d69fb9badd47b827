"""Datasets: build the train and test sets named by ``DataConfig``.

Contract: ``build_datasets(cfg)`` returns a ``Datasets`` record or raises ``UsageError`` with
where to put the data and in what format. Nothing here downloads. Each item is ``(x, label)``
with ``label`` an int64 scalar tensor or int.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from torch.utils.data import Dataset

from meshrun.train.config import DataConfig, DatasetKind


@dataclass(frozen=True)
class Datasets:
    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]  # one sample, e.g. (64,), (3, 32, 32), (512, 3)


def build_datasets(cfg: DataConfig) -> Datasets:
    # Only the named dataset's module is imported: imagefolder pulls in torchvision (1.5 s of CPU,
    # torch._dynamo with it) and every worker of every restart pays for what it imports.
    module = importlib.import_module(f"meshrun.train.data.{_MODULES[cfg.name]}")
    builder: Callable[[DataConfig], Datasets] = module.build
    return builder(cfg)


_MODULES = {DatasetKind.DIGITS: "digits", DatasetKind.CIFAR10: "cifar", DatasetKind.IMAGEFOLDER: "imagefolder",
            DatasetKind.SYNTHETIC_IMAGES: "synthetic", DatasetKind.SHAPES: "shapes",
            DatasetKind.MODELNET40: "modelnet"}
