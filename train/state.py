"""Training position and the checkpoint state dictionary.

Contract: ``capture`` is collective (it all-gathers every rank's RNG state and takes rank 0's
module buffers) and returns the same state on every rank that writes a copy (``writer``), None
elsewhere; ``apply`` restores a state on any rank at any world size. RNG streams are
restored exactly when the world size is unchanged, and re-derived from the seed, rank and step
otherwise (the old per-rank streams have no meaning on a different set of ranks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

from meshrun.train import dist, seeds
from meshrun.train.config import TrainConfig, to_dict

FORMAT = 1


@dataclass(frozen=True)
class Position:
    """Where training stands. ``consumed`` counts samples of epoch ``epoch``'s order already
    used by all ranks together; ``epoch`` is the 0-based epoch in progress, so a checkpoint at
    an epoch end has ``epoch`` = epochs completed and ``consumed`` = 0."""

    epoch: int = 0
    consumed: int = 0
    global_step: int = 0
    samples_seen: int = 0
    best_acc: float = 0.0
    last_test_acc: float = 0.0
    last_test_loss: float = float("nan")
    epoch_loss_sum: float = 0.0  # real-sample training loss so far in this epoch (all ranks)
    epoch_loss_count: int = 0
    epoch_correct: int = 0  # real-sample top-1 hits so far in this epoch (all ranks)


@dataclass(frozen=True)
class Restored:
    position: Position
    saved_world_size: int
    source_rank: int


def capture(cfg: TrainConfig, module: nn.Module, optimizer: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler | None, pos: Position, lr: float, world_size: int,
            writer: bool) -> dict[str, Any] | None:
    rng = dist.all_gather_objects(_rng_state())
    model = _with_rank0_buffers(module)
    if not writer:
        return None
    return {
        "format": FORMAT,
        "model": model,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        # The LR is a pure function of the position (train.optim), so this is informational.
        "scheduler": {"name": cfg.schedule.name.value, "last_lr": lr},
        "position": dataclasses.asdict(pos),
        "rng": rng,
        "config": to_dict(cfg),
        "world_size": world_size,
    }


def apply(state: dict[str, Any], module: nn.Module, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, seed: int, rank: int, world_size: int) -> Restored:
    assert state.get("format") == FORMAT, f"unknown checkpoint format {state.get('format')}"
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    pos = Position(**state["position"])
    if state["world_size"] == world_size:
        _set_rng_state(state["rng"][rank])
    else:
        torch.manual_seed(seeds.derive(seed, seeds.RESUME, rank, pos.global_step))
    return Restored(pos, state["world_size"], state.get("restored_from_rank", 0))


def _with_rank0_buffers(module: nn.Module) -> dict[str, Any]:
    """Collective: the module's state with rank 0's buffers (e.g. BatchNorm running statistics,
    which each rank updates from its own batch). DDP gives every rank rank 0's buffers at the
    start of each forward, so those are the ones training continues with, and with them every
    host's copy is the same. Parameters are already identical after the all-reduce."""
    state = module.state_dict()
    if not dist.active():
        return state
    buffers = {name for name, _ in module.named_buffers()}
    names = [n for n in state if n in buffers]  # state_dict order: the same on every rank
    for dtype in sorted({state[n].dtype for n in names}, key=str):  # one broadcast per dtype
        group = [n for n in names if state[n].dtype == dtype]
        flat = torch.cat([state[n].detach().reshape(-1) for n in group])
        torch_dist.broadcast(flat, 0)
        pieces = flat.split([state[n].numel() for n in group])
        for name, piece in zip(group, pieces):
            state[name] = piece.view_as(state[name]).clone()  # own storage: saved alone
    return state


def _rng_state() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(saved: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(saved["cpu"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["cuda"])
