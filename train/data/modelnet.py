"""ModelNet40 from the widely used HDF5 release (``modelnet40_ply_hdf5_2048``), read with h5py.

h5py is optional: it is imported only here, and its absence is reported as a usage error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets
from meshrun.train.errors import UsageError

NUM_CLASSES = 40
FORMAT = ("the HDF5 release modelnet40_ply_hdf5_2048 (extracted): files ply_data_train*.h5 and "
          "ply_data_test*.h5, each with datasets 'data' (N x 2048 x 3 float32) and 'label' "
          "(N x 1 integer)")


def read_split(files: list[Path], num_points: int) -> TensorDataset:
    import h5py

    points, labels = [], []
    for path in files:
        with h5py.File(path, "r") as handle:
            if "data" not in handle or "label" not in handle:
                raise UsageError(f"{path} lacks 'data' or 'label'; expected {FORMAT}")
            points.append(np.asarray(handle["data"][:, :num_points, :3], dtype=np.float32))
            labels.append(np.asarray(handle["label"], dtype=np.int64).reshape(-1))
    return TensorDataset(torch.from_numpy(np.concatenate(points)),
                         torch.from_numpy(np.concatenate(labels)))


def build(cfg: DataConfig) -> Datasets:
    root = Path(cfg.root) if cfg.root else None
    train_files = sorted(root.glob("ply_data_train*.h5")) if root else []
    test_files = sorted(root.glob("ply_data_test*.h5")) if root else []
    if not train_files or not test_files:
        raise UsageError(f"ModelNet40 not found in {cfg.root or '(data.root not set)'}: "
                         f"expected {FORMAT}; pass data.root=DIR")
    try:
        import h5py  # noqa: F401
    except ImportError:
        raise UsageError("data.name=modelnet40 needs the h5py package, which is not installed; "
                         "install it with: pip install h5py") from None
    return Datasets(train=read_split(train_files, cfg.num_points),
                    test=read_split(test_files, cfg.num_points),
                    num_classes=NUM_CLASSES, input_shape=(cfg.num_points, 3))
