"""Gradient communication: torch's own DDP comm hooks, their state, checkpoints and resets.

Contract:
- ``attach(model, cfg, world_size, saved, log)`` registers the configured hook on a DDP model
  (nothing else for ``none`` or without a process group) and returns a ``Communicator``. Only
  torch's implementations are used: ``default_hooks.fp16_compress_hook``/``bf16_compress_hook``,
  ``powerSGD_hook`` with ``PowerSGDState``, ``post_localSGD_hook`` with ``PostLocalSGDState``
  and ``PeriodicModelAverager``.
- ``Communicator.state_dict()`` is collective (it all-gathers every rank's hook state: PowerSGD's
  error feedback is per rank) and is stored in checkpoints under ``"comm"``.
- A saved state is restored only for the same hook at the same world size; otherwise the hook
  starts fresh and ``attach`` logs why (per-rank error feedback means nothing on another set of
  ranks, and the warm-up restarts).
- Local SGD's periodic averaging runs as a step post-hook of the optimizer;
  ``consensus()`` makes every rank hold the same parameters (local SGD, before evaluation and
  checkpoints); ``preserved()`` runs a timing probe past the warm-up (steady-state traffic)
  and then undoes what it did to the hook state.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                            post_localSGD_hook)
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from train import dist
from train.config import CommConfig, CommHook

FORMAT = 1


@dataclass(frozen=True)
class SavedComm:
    """What a checkpoint said about the hook: its ``"comm"`` entry and the saved world size."""

    state: dict[str, Any] | None
    world_size: int


class Communicator:
    """The registered hook and its state; a no-op for ``none`` and single-process runs."""

    def __init__(self, hook: CommHook, world_size: int, model: nn.Module | None = None,
                 powersgd: powerSGD_hook.PowerSGDState | None = None,
                 localsgd: PostLocalSGDState | None = None,
                 averager: PeriodicModelAverager | None = None) -> None:
        self.hook, self.world_size, self.model = hook, world_size, model
        self.powersgd, self.localsgd, self.averager = powersgd, localsgd, averager

    def _local_state(self) -> dict[str, Any]:
        if self.powersgd is not None:
            # torch's own picklable form: every slot except the process group.
            with _quiet():
                return {"powersgd": self.powersgd.__getstate__()}
        if self.localsgd is not None and self.averager is not None:
            return {"localsgd_iter": self.localsgd.iter, "averager_step": self.averager.step}
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Collective: ``{"format", "hook", "world_size", "ranks": [state of rank r, ...]}``."""
        ranks = dist.all_gather_objects(self._local_state()) if self.model is not None else [{}]
        return {"format": FORMAT, "hook": self.hook.value, "world_size": self.world_size,
                "ranks": ranks}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if self.powersgd is not None and "powersgd" in state:
            group = self.powersgd.process_group
            with _quiet():
                self.powersgd.__setstate__(state["powersgd"])
            self.powersgd.process_group = group
        if self.localsgd is not None and self.averager is not None and "localsgd_iter" in state:
            self.localsgd.iter = state["localsgd_iter"]
            self.averager.step = state["averager_step"]

    def _average_after_step(self, *_: Any) -> None:
        """Optimizer step post-hook: runs after ``step()`` and before ``zero_grad``, as torch's
        averager expects (it averages only parameters that have gradients)."""
        if self.averager is not None and self.model is not None:
            self.averager.average_parameters(self.model.parameters())

    def consensus(self) -> None:
        """Local SGD lets parameters drift apart between averages: average them now (collective)."""
        if self.averager is not None and self.model is not None:
            average_parameters(self.model.parameters(), self.averager.process_group)

    def _steady(self) -> None:
        """Past the warm-up, so a probe times what the hook sends in steady state."""
        if self.powersgd is not None:
            self.powersgd.iter = max(self.powersgd.iter, self.powersgd.start_powerSGD_iter)
        if self.localsgd is not None:
            self.localsgd.iter = max(self.localsgd.iter, self.localsgd.start_localSGD_iter)

    @contextlib.contextmanager
    def preserved(self) -> Iterator[None]:
        """Run the body (e.g. the comm timing probe) and put the hook state back afterwards, so
        probe steps neither count towards ``start_iter`` nor leave error feedback behind."""
        saved = copy.deepcopy(self._local_state())
        self._steady()
        try:
            yield
        finally:
            self.load_rank_state(saved)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """PowerSGDState's (de)serialization warns about its process group on every call; we keep
    the default group on purpose, and a probe or checkpoint would repeat it on every rank."""
    logger = logging.getLogger(powerSGD_hook.__name__)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def attach(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: CommConfig, rank: int,
           world_size: int, saved: SavedComm | None, log: Callable[[str], None]) -> Communicator:
    """Register ``cfg.hook`` on the DDP ``model`` and restore its saved state when it applies."""
    if not dist.active() or cfg.hook is CommHook.NONE:
        return Communicator(cfg.hook, world_size)
    if cfg.hook is CommHook.FP16:
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        comm = Communicator(cfg.hook, world_size, model)
    elif cfg.hook is CommHook.BF16:
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        comm = Communicator(cfg.hook, world_size, model)
    elif cfg.hook is CommHook.POWERSGD:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.start_iter, use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        comm = Communicator(cfg.hook, world_size, model, powersgd=state)
    else:
        # Between averages each rank steps on its own gradients (no intra-host all-reduce:
        # torch's default subgroup is per CUDA device count, meaningless on CPU hosts).
        state = PostLocalSGDState(process_group=None, subgroup=None,
                                  start_localSGD_iter=cfg.start_iter,
                                  post_local_gradient_allreduce=False)
        model.register_comm_hook(state, post_localSGD_hook)
        averager = PeriodicModelAverager(period=cfg.localsgd_period, warmup_steps=cfg.start_iter)
        comm = Communicator(cfg.hook, world_size, model, localsgd=state, averager=averager)
        optimizer.register_step_post_hook(comm._average_after_step)
    _restore(comm, rank, saved, log)
    return comm


def _restore(comm: Communicator, rank: int, saved: SavedComm | None,
             log: Callable[[str], None]) -> None:
    if saved is None or saved.state is None:
        return
    before = saved.state.get("hook", CommHook.NONE.value)
    if before != comm.hook.value:
        log(f"comm: checkpoint was saved with comm.hook={before}, now {comm.hook.value}: "
            "the hook starts with a fresh state")
    elif saved.world_size != comm.world_size:
        log(f"comm: world size changed ({saved.world_size} -> {comm.world_size}): "
            f"{comm.hook.value} hook state reset (per-rank error feedback and warm-up start over)")
    else:
        comm.load_rank_state(saved.state["ranks"][rank])
        if comm.hook in (CommHook.POWERSGD, CommHook.LOCALSGD):
            log(f"comm: {comm.hook.value} hook state restored from the checkpoint")


def gradient_shapes(module: nn.Module) -> list[list[int]]:
    """Shapes of the parameters DDP all-reduces (those that take gradients)."""
    return [list(p.shape) for p in module.parameters() if p.requires_grad]


__all__ = ["SavedComm", "Communicator", "attach", "gradient_shapes"]
