"""ImageFolder data (``root/train/<class>/*.jpg``, ``root/val/<class>/*.jpg``), seed 004 style."""

from __future__ import annotations

from pathlib import Path

from torchvision import datasets, transforms

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets
from meshrun.train.errors import UsageError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FORMAT = ("two directories train/ and val/, each with one subdirectory per class holding that "
          "class's images (jpg/png), the same class names in both")


def build(cfg: DataConfig) -> Datasets:
    root = Path(cfg.root) if cfg.root else None
    if root is None or not (root / "train").is_dir() or not (root / "val").is_dir():
        raise UsageError(f"ImageFolder data not found in {cfg.root or '(data.root not set)'}: "
                         f"expected {FORMAT}; pass data.root=DIR")
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    size = cfg.image_size
    train_tf = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()] \
        if cfg.augment else [transforms.Resize(size * 256 // 224), transforms.CenterCrop(size)]
    try:
        train = datasets.ImageFolder(str(root / "train"), transforms.Compose(
            [*train_tf, transforms.ToTensor(), normalize]))
        val = datasets.ImageFolder(str(root / "val"), transforms.Compose([
            transforms.Resize(size * 256 // 224), transforms.CenterCrop(size),
            transforms.ToTensor(), normalize]))
    except FileNotFoundError as err:  # torchvision: no class folders or no images in them
        raise UsageError(f"ImageFolder data in {root} is incomplete ({err}); expected {FORMAT}") \
            from None
    if train.classes != val.classes:
        raise UsageError(f"{root}: train/ and val/ have different classes "
                         f"({train.classes} vs {val.classes}); expected {FORMAT}")
    return Datasets(train=train, test=val, num_classes=len(train.classes),
                    input_shape=(3, size, size))
