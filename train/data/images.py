"""In-memory image tensors with CIFAR-style augmentation drawn from torch's global RNG.

Augmentation uses the process's torch RNG (not numpy or Python ``random``), which the
checkpoint saves and restores per rank, so a resume at the same world size with
``num_workers=0`` replays exactly the same crops and flips.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

HALF = (0.5, 0.5, 0.5)  # seed 000's Normalize((0.5,)*3, (0.5,)*3)


class ImageTensors(Dataset):
    """``images``: uint8 ``(N, C, H, W)``; items are normalized float images and int labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: bool,
                 mean: tuple[float, ...] = HALF, std: tuple[float, ...] = HALF) -> None:
        assert images.dtype == torch.uint8 and images.ndim == 4 and len(images) == len(labels)
        self.images, self.labels, self.augment = images, labels.long(), augment
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = (self.images[index].float() / 255.0 - self.mean) / self.std
        if self.augment:
            x = random_crop_flip(x, pad=4)
        return x, self.labels[index]


def random_crop_flip(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Random ``pad``-pixel translation (zero padding) and horizontal flip."""
    h, w = x.shape[-2:]
    top, left, flip = torch.randint(0, 2 * pad + 1, (2,)).tolist() + [torch.rand(()) < 0.5]
    x = F.pad(x, (pad, pad, pad, pad))[..., top:top + h, left:left + w]
    return x.flip(-1) if flip else x
