"""Every random stream of a run is seeded from (seed, role, rank, ...) by a hash (train/seeds.py),
so the streams of different seeds, roles and ranks are unrelated. Before, the initial weights
used ``seed``, rank r's dropout/augmentation ``seed + 1 + r`` and an elastic resume
``seed + r + 7919 * step``: rank 1 of seed 0, rank 0 of seed 1 and the initial weights of seed 2
drew the same numbers, so a seed sweep's runs were not independent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from meshrun.train import seeds, state
from meshrun.train.config import load_config
from meshrun.train.data import build_datasets
from meshrun.train.dist import DistEnv
from meshrun.train.models import build_model
from meshrun.train.render import make_console

SEEDS = RANKS = range(4)


def every_seed() -> list[int]:
    out = []
    for seed in SEEDS:
        out.append(seeds.derive(seed, seeds.INIT))
        for rank in RANKS:
            out.append(seeds.derive(seed, seeds.RANK, rank))
            out += [seeds.derive(seed, seeds.RESUME, rank, step) for step in range(4)]
            out += [seeds.derive(seed, seeds.LOADER, rank, epoch, consumed)
                    for epoch in range(2) for consumed in (0, 64)]
    return out


def test_all_derived_seeds_are_distinct_and_fit_a_generator() -> None:
    got = every_seed()
    assert len(got) == 4 * (1 + 4 * (1 + 4 + 4)) and len(set(got)) == len(got)
    assert all(0 <= s < 2 ** 63 for s in got)
    assert got == every_seed()  # a pure function: every host and every run agree
    torch.Generator().manual_seed(max(got))


def rng_after_elastic_apply(seed: int, rank: int, step: int) -> torch.Tensor:
    """The stream ``state.apply`` gives ``rank`` when the world size changed (2 -> 3)."""
    module = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    saved = {"format": state.FORMAT, "model": module.state_dict(),
             "optimizer": optimizer.state_dict(), "scaler": None, "world_size": 2,
             "position": dataclasses.asdict(state.Position(global_step=step)), "rng": []}
    state.apply(saved, module, optimizer, None, seed, rank, 3)
    return torch.get_rng_state()


def test_elastic_resume_streams_of_different_seeds_and_ranks_differ() -> None:
    assert not torch.equal(rng_after_elastic_apply(0, 1, 5), rng_after_elastic_apply(1, 0, 5))
    torch.manual_seed(seeds.derive(2, seeds.RESUME, 1, 5))
    assert torch.equal(rng_after_elastic_apply(2, 1, 5), torch.get_rng_state())


def test_trainer_draws_weights_and_rank_stream_from_their_own_seeds(tmp_path: Path) -> None:
    from meshrun.train.trainer import Trainer

    cfg = load_config(None, ("seed=2", "log.tensorboard=false"))
    trainer = Trainer(cfg, DistEnv(launched=False), tmp_path / "run", torch.device("cpu"),
                      make_console(False, 1))
    trainer.close()
    after = torch.get_rng_state()
    torch.manual_seed(seeds.derive(2, seeds.RANK, 0))
    assert torch.equal(after, torch.get_rng_state())
    torch.manual_seed(seeds.derive(2, seeds.INIT))
    data = build_datasets(cfg.data)
    expected = build_model(cfg.model, data.num_classes, data.input_shape).state_dict()
    got = trainer.module.state_dict()
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    torch.manual_seed(2)  # the old initial weights: rank 1 of seed 0's stream, too
    old = build_model(cfg.model, data.num_classes, data.input_shape).state_dict()
    assert not all(torch.equal(got[k], v) for k, v in old.items())
