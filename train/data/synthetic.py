"""Deterministic synthetic images: any size and class count, generated per index, learnable.

Sample ``i`` of a split is ``template[label] + noise`` where templates and noise come from
generators seeded by (split seed, class) and (split seed, index): the same on every rank, in
every run, without storing the dataset.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets

NOISE = 1.0


class SyntheticImages(Dataset):
    def __init__(self, size: int, num_classes: int, image_size: int, template_seed: int,
                 noise_seed: int) -> None:
        self.size, self.num_classes, self.seed = size, num_classes, noise_seed
        self.shape = (3, image_size, image_size)
        gen = torch.Generator().manual_seed(template_seed)
        self.templates = torch.randn(num_classes, *self.shape, generator=gen) * 0.5

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % self.num_classes
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return self.templates[label] + NOISE * torch.randn(self.shape, generator=gen), label


def build(cfg: DataConfig) -> Datasets:
    # Train and test share templates (same classes) but not noise (different index streams).
    seed = cfg.split_seed
    train = SyntheticImages(cfg.train_size, cfg.num_classes, cfg.image_size, seed, seed)
    test = SyntheticImages(cfg.test_size, cfg.num_classes, cfg.image_size, seed, seed + 7_777_777)
    return Datasets(train=train, test=test, num_classes=cfg.num_classes,
                    input_shape=(3, cfg.image_size, cfg.image_size))
