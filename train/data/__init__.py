"""Datasets: build the train and test sets named by ``DataConfig``.

Contract: ``build_datasets(cfg)`` returns a ``Datasets`` record or raises ``UsageError`` with
where to put the data and in what format. Nothing here downloads. Each item is ``(x, label)``
with ``label`` an int64 scalar tensor or int.
"""

from __future__ import annotations

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
    builder = _builders()[cfg.name]
    return builder(cfg)


def _builders() -> dict[DatasetKind, Callable[[DataConfig], Datasets]]:
    from meshrun.train.data import cifar, digits, imagefolder, modelnet, shapes, synthetic

    return {DatasetKind.DIGITS: digits.build, DatasetKind.CIFAR10: cifar.build,
            DatasetKind.IMAGEFOLDER: imagefolder.build,
            DatasetKind.SYNTHETIC_IMAGES: synthetic.build, DatasetKind.SHAPES: shapes.build,
            DatasetKind.MODELNET40: modelnet.build}
