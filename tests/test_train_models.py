"""Model builders and the PointNet++ geometry primitives."""

from __future__ import annotations

import pytest
import torch

from meshrun.train.config import ModelConfig, ModelKind
from meshrun.train.errors import UsageError
from meshrun.train.models import build_model
from meshrun.train.models.pointnet2 import ball_query, farthest_point_sample, gather


def test_farthest_point_sample_picks_extremes() -> None:
    xyz = torch.tensor([[[0.0, 0, 0], [0.1, 0, 0], [5, 0, 0], [0, 3, 0], [0.2, 0.1, 0]]])
    assert farthest_point_sample(xyz, 3).tolist() == [[0, 2, 3]]


def test_ball_query_stays_within_radius_and_pads_with_first() -> None:
    xyz = torch.tensor([[[0.0, 0, 0], [0.5, 0, 0], [2, 0, 0], [0, 0.9, 0]]])
    idx = ball_query(1.0, 3, xyz, xyz[:, [0, 2]])
    assert idx.tolist() == [[[0, 1, 3], [2, 2, 2]]]
    assert (gather(xyz, idx)[0, 0] - xyz[0, 0]).norm(dim=-1).max() <= 1.0


def _ball_query_by_sort(radius: float, nsample: int, xyz: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """The definition: every index in radius, sorted, the first nsample; short groups padded."""
    n = xyz.shape[1]
    order = torch.arange(n).expand(centers.shape[0], centers.shape[1], n)
    idx = torch.where(torch.cdist(centers, xyz).pow(2) <= radius ** 2, order, torch.full_like(order, n))
    idx = idx.sort(dim=-1).values[..., :nsample]
    return torch.where(idx == n, idx[..., :1].expand_as(idx), idx)


@pytest.mark.parametrize("batch, points, centers, nsample, radius", [
    (4, 256, 64, 16, 0.2), (2, 1024, 128, 32, 0.4), (2, 64, 32, 128, 0.5), (3, 10, 5, 16, 10.0)])
def test_ball_query_is_the_sorted_definition(batch: int, points: int, centers: int, nsample: int,
                                             radius: float) -> None:
    """ball_query takes the nsample smallest indices with topk: the same groups as sorting all of
    them, nsample past the cloud's size included."""
    xyz = torch.rand(batch, points, 3, generator=torch.Generator().manual_seed(points))
    assert torch.equal(ball_query(radius, nsample, xyz, xyz[:, :centers]),
                       _ball_query_by_sort(radius, nsample, xyz, xyz[:, :centers]))


@pytest.mark.parametrize("cfg, shape", [
    (ModelConfig(name=ModelKind.TOY), (3, 32, 32)),
    (ModelConfig(name=ModelKind.TORCHVISION, arch="resnet18", small_stem=True), (3, 32, 32)),
    (ModelConfig(name=ModelKind.MLP, hidden=(16,)), (64,)),
    (ModelConfig(name=ModelKind.POINTNET2, sa_points=(16, 8), sa_radius=(0.4, 0.8), sa_samples=8,
                 width=8), (64, 3)),
])
def test_models_map_batches_to_logits(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    model = build_model(cfg, 7, shape).eval()
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_small_stem_keeps_resolution() -> None:
    model = build_model(ModelConfig(name=ModelKind.TORCHVISION, small_stem=True), 10, (3, 32, 32))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_unknown_torchvision_arch_suggests_one() -> None:
    with pytest.raises(UsageError, match=r"^model.arch='resnet81' is not a torchvision "
                                         r"classification model \(did you mean 'resnet18'\?\)"):
        build_model(ModelConfig(name=ModelKind.TORCHVISION, arch="resnet81"), 10, (3, 32, 32))


def test_toy_model_rejects_other_sizes() -> None:
    with pytest.raises(UsageError, match="needs 3x32x32 images"):
        build_model(ModelConfig(name=ModelKind.TOY), 10, (3, 64, 64))


def test_every_model_kind_names_a_builder() -> None:
    from meshrun.train.models import _MODULES

    assert set(_MODULES) == set(ModelKind)
