"""scikit-learn's 8x8 digits (bundled with sklearn, no download) with a fixed held-out split."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets


def build(cfg: DataConfig) -> Datasets:
    """Split with ``split_seed`` (independent of the training seed, so every run and every rank
    sees the same test set), then standardize features with train-set statistics."""
    x, y = load_digits()
    order = np.random.RandomState(cfg.split_seed).permutation(len(x))
    n_test = int(round(len(x) * cfg.test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    mean = x[train_idx].mean(axis=0)
    std = x[train_idx].std(axis=0)
    std[std == 0] = 1.0  # always-blank border pixels
    x = (x - mean) / std

    def subset(idx: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.as_tensor(x[idx], dtype=torch.float32),
                             torch.as_tensor(y[idx], dtype=torch.int64))

    return Datasets(train=subset(train_idx), test=subset(test_idx), num_classes=10,
                    input_shape=(64,))


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's ``load_digits(return_X_y=True)``, read from the CSV it ships without importing
    sklearn (1.1 s of CPU in every worker of every restart); sklearn's own loader where a release
    keeps the file elsewhere."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    locations = spec.submodule_search_locations if spec else None
    csv = Path(locations[0]) / "datasets" / "data" / "digits.csv.gz" if locations else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits as sklearn_load_digits

        return sklearn_load_digits(return_X_y=True)
    with gzip.open(csv, "rt") as lines:
        data = np.loadtxt(lines, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)
