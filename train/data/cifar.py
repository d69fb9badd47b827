"""CIFAR-10 from a local directory in the python-pickle batch format (nothing downloads)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets
from meshrun.train.data.images import ImageTensors
from meshrun.train.errors import UsageError

SUBDIR = "cifar-10-batches-py"
FORMAT = ("the python version of CIFAR-10 (cifar-10-python.tar.gz from "
          "https://www.cs.toronto.edu/~kriz/cifar.html, extracted): files data_batch_1 .. "
          "data_batch_5 and test_batch, each a pickled dict with b'data' (N x 3072 uint8, "
          "channel-major 32x32) and b'labels'")


def locate(root: str) -> Path:
    """``root`` itself or its ``cifar-10-batches-py`` subdirectory, whichever has the files."""
    if not root:
        raise UsageError(f"data.root is not set for data.name=cifar10; put {FORMAT} in a "
                         f"directory and pass data.root=DIR")
    for candidate in (Path(root), Path(root) / SUBDIR):
        if (candidate / "test_batch").is_file() and any(candidate.glob("data_batch_*")):
            return candidate
    raise UsageError(f"CIFAR-10 not found in {root} (nor in {Path(root) / SUBDIR}): expected "
                     f"{FORMAT}")


def read_batches(files: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for path in files:
        with open(path, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        try:
            images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(batch[b"labels"])
        except (KeyError, ValueError) as err:
            raise UsageError(f"{path} is not a CIFAR-10 batch ({err}); expected {FORMAT}") from None
    return torch.from_numpy(np.concatenate(images)), torch.tensor(labels, dtype=torch.int64)


def build(cfg: DataConfig) -> Datasets:
    root = locate(cfg.root)
    train_x, train_y = read_batches(sorted(root.glob("data_batch_*")))
    test_x, test_y = read_batches([root / "test_batch"])
    return Datasets(train=ImageTensors(train_x, train_y, cfg.augment),
                    test=ImageTensors(test_x, test_y, augment=False),
                    num_classes=10, input_shape=(3, 32, 32))
