"""Generated point-cloud shapes: a real, learnable classification set that needs no files.

Each sample is ``num_points`` points on the surface of one shape class, under a random 3D
rotation, random per-axis scale (0.85-1.15), Gaussian noise (sigma 0.01), centred and scaled to
the unit sphere. Sample ``i`` of a split is generated from a seed derived from (split seed,
split, i), so the set is identical on every rank and in every run.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from meshrun.train.config import DataConfig
from meshrun.train.data import Datasets
from meshrun.train.errors import UsageError

Sampler = Callable[[np.random.RandomState, int], np.ndarray]


def _mesh(vertices: list[tuple[float, float, float]], faces: list[tuple[int, int, int]]) -> Sampler:
    v = np.asarray(vertices, dtype=np.float64)
    tri = v[np.asarray(faces)]  # (F, 3 corners, 3)
    areas = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)

    def sample(rng: np.random.RandomState, n: int) -> np.ndarray:
        face = rng.choice(len(tri), size=n, p=areas / areas.sum())
        a, b = rng.rand(2, n)
        flip = a + b > 1  # reflect into the triangle: uniform barycentric coordinates
        a, b = np.where(flip, 1 - a, a), np.where(flip, 1 - b, b)
        t = tri[face]
        return t[:, 0] + a[:, None] * (t[:, 1] - t[:, 0]) + b[:, None] * (t[:, 2] - t[:, 0])
    return sample


def _sphere(rng: np.random.RandomState, n: int) -> np.ndarray:
    p = rng.randn(n, 3)
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def _cylinder(rng: np.random.RandomState, n: int, r: float = 0.6, h: float = 2.0) -> np.ndarray:
    side = rng.rand(n) < (h / (h + r))  # side area 2*pi*r*h vs caps 2*pi*r^2
    theta = rng.rand(n) * 2 * math.pi
    rad = np.where(side, r, r * np.sqrt(rng.rand(n)))
    z = np.where(side, (rng.rand(n) - 0.5) * h, np.sign(rng.rand(n) - 0.5) * h / 2)
    return np.stack([rad * np.cos(theta), rad * np.sin(theta), z], axis=1)


def _cone(rng: np.random.RandomState, n: int, r: float = 0.8, h: float = 1.6) -> np.ndarray:
    slant = math.hypot(r, h)
    lateral = rng.rand(n) < slant / (slant + r)  # lateral area pi*r*s vs base pi*r^2
    theta = rng.rand(n) * 2 * math.pi
    u = np.sqrt(rng.rand(n))  # uniform over the disk / cone surface
    rad = r * u
    z = np.where(lateral, h * (1 - u), 0.0) - h / 3
    return np.stack([rad * np.cos(theta), rad * np.sin(theta), z], axis=1)


def _torus(rng: np.random.RandomState, n: int, big: float = 0.7, small: float = 0.25) -> np.ndarray:
    theta, phi = rng.rand(2, n) * 2 * math.pi
    ring = big + small * np.cos(phi)
    return np.stack([ring * np.cos(theta), ring * np.sin(theta), small * np.sin(phi)], axis=1)


_CUBE_V = [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
_CUBE_F = [(0, 1, 3), (0, 3, 2), (4, 5, 7), (4, 7, 6), (0, 1, 5), (0, 5, 4), (2, 3, 7), (2, 7, 6),
           (0, 2, 6), (0, 6, 4), (1, 3, 7), (1, 7, 5)]
_OCTA_V = [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]
_OCTA_F = [(a, b, c) for a in (0, 1) for b in (2, 3) for c in (4, 5)]
_PYRAMID_V = [(-1, -1, -0.5), (1, -1, -0.5), (1, 1, -0.5), (-1, 1, -0.5), (0, 0, 1.2)]
_PYRAMID_F = [(0, 1, 2), (0, 2, 3), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)]
_TETRA_V = [(1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1)]
_TETRA_F = [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]

SHAPES: dict[str, Sampler] = {
    "sphere": _sphere, "cube": _mesh(_CUBE_V, _CUBE_F), "cylinder": _cylinder, "cone": _cone,
    "torus": _torus, "pyramid": _mesh(_PYRAMID_V, _PYRAMID_F),
    "octahedron": _mesh(_OCTA_V, _OCTA_F), "tetrahedron": _mesh(_TETRA_V, _TETRA_F),
}


def random_rotation(rng: np.random.RandomState) -> np.ndarray:
    q, r = np.linalg.qr(rng.randn(3, 3))
    q = q * np.sign(np.diag(r))  # uniform over O(3); fix the sign to get a proper rotation
    return q if np.linalg.det(q) > 0 else -q


def make_cloud(kind: str, rng: np.random.RandomState, n: int) -> np.ndarray:
    p = SHAPES[kind](rng, n) * rng.uniform(0.85, 1.15, size=3)
    p = p @ random_rotation(rng).T + rng.randn(n, 3) * 0.01
    p -= p.mean(axis=0)
    return (p / np.linalg.norm(p, axis=1).max()).astype(np.float32)


def generate(size: int, num_classes: int, n_points: int, seed: int) -> TensorDataset:
    kinds = list(SHAPES)[:num_classes]
    clouds = np.stack([make_cloud(kinds[i % num_classes], np.random.RandomState((seed + i) % 2**32), n_points)
                       for i in range(size)])
    labels = torch.arange(size) % num_classes
    return TensorDataset(torch.from_numpy(clouds), labels)


class Augmented(Dataset):
    """Train-time augmentation: a fresh random rotation and per-axis scale (0.9-1.1) per draw,
    from torch's global RNG (saved in checkpoints, so resumes replay it exactly)."""

    def __init__(self, inner: TensorDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.inner[index]
        q, r = torch.linalg.qr(torch.randn(3, 3))
        q = q * torch.sign(torch.diagonal(r))
        x = (x * (0.9 + 0.2 * torch.rand(3))) @ q.T
        return x / x.norm(dim=1).max(), y


def build(cfg: DataConfig) -> Datasets:
    if not 2 <= cfg.num_classes <= len(SHAPES):
        raise UsageError(f"data.num_classes={cfg.num_classes} for data.name=shapes must be "
                         f"between 2 and {len(SHAPES)} ({', '.join(SHAPES)})")
    base = cfg.split_seed * 10_000_019
    train = generate(cfg.train_size, cfg.num_classes, cfg.num_points, base)
    return Datasets(train=Augmented(train) if cfg.augment else train,
                    test=generate(cfg.test_size, cfg.num_classes, cfg.num_points,
                                  base + 5_000_011),
                    num_classes=cfg.num_classes, input_shape=(cfg.num_points, 3))
