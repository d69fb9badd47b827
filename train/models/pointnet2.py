"""PointNet++ classification with single-scale grouping (Qi et al. 2017), in plain torch.

No custom CUDA kernels: farthest point sampling, ball query and grouping are written with
tensor ops, so the same code runs on CPU and GPU. Input: ``(batch, points, 3)`` coordinates.
Channel widths scale with ``model.width`` (64 gives the paper's 64-128-256-512-1024 layout).
"""

from __future__ import annotations

import torch
from torch import nn

from meshrun.train.config import ModelConfig
from meshrun.train.errors import UsageError


def farthest_point_sample(xyz: torch.Tensor, npoint: int) -> torch.Tensor:
    """Indices ``(B, npoint)`` of points chosen greedily to be far from those already chosen.
    Starts from point 0, so the result is deterministic."""
    batch, n, _ = xyz.shape
    chosen = torch.zeros(batch, npoint, dtype=torch.long, device=xyz.device)
    dist = torch.full((batch, n), float("inf"), device=xyz.device)
    farthest = torch.zeros(batch, dtype=torch.long, device=xyz.device)
    rows = torch.arange(batch, device=xyz.device)
    for i in range(npoint):
        chosen[:, i] = farthest
        centroid = xyz[rows, farthest].unsqueeze(1)
        dist = torch.minimum(dist, ((xyz - centroid) ** 2).sum(-1))
        farthest = dist.argmax(-1)
    return chosen


def ball_query(radius: float, nsample: int, xyz: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Indices ``(B, S, nsample)`` of up to ``nsample`` points within ``radius`` of each center,
    in point order; short groups repeat their first member (the center itself is always in)."""
    n = xyz.shape[1]
    sqdist = torch.cdist(centers, xyz).pow(2)
    order = torch.arange(n, device=xyz.device).expand_as(sqdist)
    idx = torch.where(sqdist <= radius ** 2, order, torch.full_like(order, n))
    # The nsample smallest indices, in order: topk, not a sort of all n (the same result, as the
    # indices in radius are distinct and the rest, all n, are replaced below; a fifth of the model's CPU).
    idx = idx.topk(min(nsample, n), dim=-1, largest=False, sorted=True).values
    first = idx[..., :1].expand_as(idx)
    return torch.where(idx == n, first, idx)


def gather(points: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``points[b, idx[b, ...]]`` for ``points (B, N, C)`` and any ``idx (B, ...)``."""
    batch = points.shape[0]
    flat = idx.reshape(batch, -1)
    out = points.gather(1, flat.unsqueeze(-1).expand(-1, -1, points.shape[-1]))
    return out.reshape(*idx.shape, points.shape[-1])


def shared_mlp(channels: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for c_in, c_out in zip(channels, channels[1:]):
        layers += [nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
    return nn.Sequential(*layers)


class SetAbstraction(nn.Module):
    """Sample ``npoint`` centroids, group neighbours within ``radius`` (coordinates relative to
    the centroid, concatenated with their features), apply a shared MLP, max-pool each group.
    ``npoint=0`` groups all points into one."""

    def __init__(self, npoint: int, radius: float, nsample: int, channels: list[int]) -> None:
        super().__init__()
        self.npoint, self.radius, self.nsample = npoint, radius, nsample
        self.mlp = shared_mlp(channels)

    def forward(self, xyz: torch.Tensor, feats: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.npoint == 0:
            centers = xyz.new_zeros(xyz.shape[0], 1, 3)
            grouped = xyz.unsqueeze(1)
            grouped_feats = feats.unsqueeze(1) if feats is not None else None
        else:
            centers = gather(xyz, farthest_point_sample(xyz, self.npoint))
            idx = ball_query(self.radius, self.nsample, xyz, centers)
            # Offsets in units of the radius, so every level sees inputs of similar scale.
            grouped = (gather(xyz, idx) - centers.unsqueeze(2)) / self.radius
            grouped_feats = gather(feats, idx) if feats is not None else None
        x = grouped if grouped_feats is None else torch.cat([grouped, grouped_feats], dim=-1)
        x = self.mlp(x.permute(0, 3, 2, 1))  # (B, C, K, S): conv over channels
        return centers, x.max(dim=2).values.transpose(1, 2)


class PointNet2SSG(nn.Module):
    def __init__(self, num_classes: int, sa_points: tuple[int, ...], sa_radius: tuple[float, ...],
                 nsample: int, width: int, dropout: float) -> None:
        super().__init__()
        w = width
        widths = [[w, w, 2 * w], [2 * w, 2 * w, 4 * w]][:len(sa_points)]
        levels, c_in = [], 0
        for npoint, radius, mlp in zip(sa_points, sa_radius, widths):
            levels.append(SetAbstraction(npoint, radius, nsample, [c_in + 3, *mlp]))
            c_in = mlp[-1]
        levels.append(SetAbstraction(0, 0.0, 0, [c_in + 3, 4 * w, 8 * w, 16 * w]))
        self.levels = nn.ModuleList(levels)
        self.head = nn.Sequential(
            nn.Linear(16 * w, 8 * w, bias=False), nn.BatchNorm1d(8 * w), nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(8 * w, 4 * w, bias=False), nn.BatchNorm1d(4 * w), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(4 * w, num_classes))

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        feats = None
        for level in self.levels:
            xyz, feats = level(xyz, feats)
        assert feats is not None
        return self.head(feats.squeeze(1))


def build(cfg: ModelConfig, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    if len(input_shape) != 2 or input_shape[1] != 3:
        raise UsageError(f"model.name=pointnet2 needs point clouds of shape (points, 3), but "
                         f"the dataset gives {input_shape}; use data.name=shapes or modelnet40")
    if len(cfg.sa_points) != len(cfg.sa_radius) or not 1 <= len(cfg.sa_points) <= 2:
        raise UsageError("model.sa_points and model.sa_radius must both list 1 or 2 levels, e.g. "
                         "model.sa_points=[256,64] model.sa_radius=[0.2,0.4]")
    return PointNet2SSG(num_classes, cfg.sa_points, cfg.sa_radius, cfg.sa_samples, cfg.width,
                        cfg.dropout)
