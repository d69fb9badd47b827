"""Datasets from tiny files in the real formats, generated data, and missing-data messages."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from meshrun.train.config import DataConfig, DatasetKind
from meshrun.train.data import build_datasets
from meshrun.train.data.shapes import SHAPES
from meshrun.train.errors import UsageError


def write_cifar(root: Path, per_batch: int = 6, batches: int = 2) -> None:
    """CIFAR-10 python-pickle batches: dict with b'data' (N x 3072 uint8) and b'labels'."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    names = [f"data_batch_{i}" for i in range(1, batches + 1)] + ["test_batch"]
    for name in names:
        batch = {b"data": rng.randint(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.randint(0, 10, per_batch)],
                 b"batch_label": name.encode()}
        with open(root / name, "wb") as handle:
            pickle.dump(batch, handle)


def test_cifar_pickle_batches(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar-10-batches-py")
    data = build_datasets(DataConfig(name=DatasetKind.CIFAR10, root=str(tmp_path), augment=False))
    assert (len(data.train), len(data.test), data.num_classes) == (12, 6, 10)
    x, y = data.train[0]
    assert x.shape == (3, 32, 32) and -1.0 <= x.min() and x.max() <= 1.0
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as handle:
        raw = pickle.load(handle)
    expected = torch.tensor(raw[b"data"][0], dtype=torch.float32).view(3, 32, 32) / 255 * 2 - 1
    assert torch.allclose(x, expected, atol=1e-6) and int(y) == raw[b"labels"][0]


def test_cifar_missing_says_where_and_what(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        build_datasets(DataConfig(name=DatasetKind.CIFAR10, root=str(tmp_path)))
    assert str(info.value).startswith(
        f"CIFAR-10 not found in {tmp_path} (nor in {tmp_path / 'cifar-10-batches-py'}): expected "
        "the python version of CIFAR-10 (cifar-10-python.tar.gz from")
    assert "data_batch_1 .. data_batch_5 and test_batch" in str(info.value)


def test_imagefolder_tree(tmp_path: Path) -> None:
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (40, 30), (i * 90, 50, 200)).save(tmp_path / split / cls / f"{i}.png")
    data = build_datasets(DataConfig(name=DatasetKind.IMAGEFOLDER, root=str(tmp_path),
                                     image_size=24))
    assert (len(data.train), len(data.test), data.num_classes) == (4, 4, 2)
    assert data.train[0][0].shape == (3, 24, 24) and data.test[3][1] == 1


def test_imagefolder_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^ImageFolder data not found in .*: expected two "
                                         r"directories train/ and val/"):
        build_datasets(DataConfig(name=DatasetKind.IMAGEFOLDER, root=str(tmp_path)))


def test_synthetic_images_are_deterministic() -> None:
    cfg = DataConfig(name=DatasetKind.SYNTHETIC_IMAGES, image_size=8, num_classes=3,
                     train_size=9, test_size=6)
    a, b = build_datasets(cfg), build_datasets(cfg)
    assert torch.equal(a.train[4][0], b.train[4][0]) and a.train[4][1] == 1
    assert not torch.equal(a.train[0][0], a.test[0][0])
    assert a.input_shape == (3, 8, 8) and len(a.test) == 6


def test_shapes_cover_all_classes_deterministically() -> None:
    cfg = DataConfig(name=DatasetKind.SHAPES, num_classes=len(SHAPES), num_points=64,
                     train_size=16, test_size=8)
    a, b = build_datasets(cfg), build_datasets(cfg)
    x, y = a.train.inner.tensors
    assert x.shape == (16, 64, 3) and sorted(set(y.tolist())) == list(range(len(SHAPES)))
    assert torch.equal(x, b.train.inner.tensors[0]) and not torch.equal(x[:8], a.test.tensors[0])
    assert torch.allclose(x.norm(dim=-1).amax(dim=1), torch.ones(16))  # unit sphere


def test_modelnet40_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^ModelNet40 not found in .*: expected the HDF5 release "
                                         r"modelnet40_ply_hdf5_2048"):
        build_datasets(DataConfig(name=DatasetKind.MODELNET40, root=str(tmp_path)))


def test_modelnet40_hdf5(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    rng = np.random.RandomState(1)
    for name, n in (("ply_data_train0.h5", 5), ("ply_data_train1.h5", 3), ("ply_data_test0.h5", 4)):
        with h5py.File(tmp_path / name, "w") as handle:
            handle["data"] = rng.rand(n, 2048, 3).astype(np.float32)
            handle["label"] = rng.randint(0, 40, (n, 1)).astype(np.uint8)
    data = build_datasets(DataConfig(name=DatasetKind.MODELNET40, root=str(tmp_path),
                                     num_points=128))
    assert (len(data.train), len(data.test), data.num_classes) == (8, 4, 40)
    assert data.train[0][0].shape == (128, 3)


def test_digits_are_sklearns_digits_read_without_importing_sklearn() -> None:
    """The trainer's default data: sklearn's own `load_digits`, row for row, from its shipped CSV."""
    from sklearn.datasets import load_digits as sklearn_load_digits

    from meshrun.train.data.digits import load_digits

    x, y = load_digits()
    expected_x, expected_y = sklearn_load_digits(return_X_y=True)
    assert np.array_equal(x, expected_x) and np.array_equal(y, expected_y)
    assert (x.dtype, y.dtype) == (expected_x.dtype, expected_y.dtype)


def test_every_dataset_kind_names_a_builder() -> None:
    from meshrun.train.data import _MODULES

    assert set(_MODULES) == set(DatasetKind)


def test_a_default_worker_imports_neither_torchvision_nor_sklearn() -> None:
    """Every worker of every (re)start builds its data and model: the default digits MLP must not
    pay 2.6 s of CPU importing torchvision and sklearn, which it does not use."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from meshrun.train.config import load_config\n"
             "from meshrun.train.data import build_datasets\n"
             "from meshrun.train.models import build_model\n"
             "cfg = load_config()\n"
             "data = build_datasets(cfg.data)\n"
             "build_model(cfg.model, data.num_classes, data.input_shape)\n"
             "print(sorted(m for m in ('torchvision', 'sklearn') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
