"""Gradient communication: torch's own DDP comm hooks, their state, checkpoints and resets.

Contract:
- ``attach(model, cfg, world_size, saved, log)`` registers the configured hook on a DDP model
  (nothing else for ``none`` or without a process group) and returns a ``Communicator``. Only
  torch's implementations are used: ``default_hooks.fp16_compress_hook``/``bf16_compress_hook``,
  ``powerSGD_hook`` with ``PowerSGDState``, ``post_localSGD_hook`` with ``PostLocalSGDState``
  and ``PeriodicModelAverager``; DiLoCo (``train.diloco``) with ``debugging_hooks.noop_hook``
  (inner steps communicate nothing), ``torch.optim.SGD`` and ``torch.distributed.all_reduce``.
- ``Communicator.state_dict()`` is collective (it all-gathers every rank's hook state: PowerSGD's
  error feedback is per rank) and is stored in checkpoints under ``"comm"``.
- A saved state is restored only for the same hook at the same world size; otherwise the hook
  starts fresh and ``attach`` logs why (per-rank error feedback means nothing on another set of
  ranks, and the warm-up restarts). A saved outer state (``diloco``, ``diloco-overlap``,
  ``hier``) is never dropped: under another outer hook the interrupted round is completed as at
  another world size (the three save the same shape); under a flat hook, or in a single process,
  it is completed into the model (``diloco.fold``). Each case is one log line; a checkpoint of
  an outer hook written without a process group has no outer state: its model is the model.
- Local SGD averages in ``stepped()`` after every optimizer step, also one that fp16's scaler skipped
  on this rank only (a step post-hook would not run there, and the ranks' averages would pair up
  with other collectives); its checkpoint state is each rank's counters, optimizer and scaler.
  ``consensus()`` makes every rank hold the same parameters (local SGD, before evaluation and
  checkpoints); ``preserved()`` runs a timing probe past the warm-up and then undoes it.
- DiLoCo: ``stepped(samples)`` after every optimizer step ends a round every H steps;
  ``consensus()`` flushes (the partial round becomes an outer step); ``before_save()`` changes
  nothing, since its checkpoint state holds every rank's replica, inner optimizer and fp16 loss
  scaler plus the shared outer state (``"diloco"``); only hier on one site ends its round first
  (the anchor follows the model: the checkpoint then resumes exactly on any sites). At a new world size the
  interrupted round is completed from the saved replicas instead of being dropped
  (``DiLoCo.restore_other_world``).
- ``hier`` (docs/sites.md): the DDP model runs over this rank's site (``train.sites``), with DDP's
  own gradient all-reduce inside the site, and DiLoCo-overlap between sites over the sites'
  route; ``peers`` (the site's ranks) scale each loss to the site's exact mean. The checkpoint
  also holds every rank's site: resumed on other sites (or another world size), the interrupted
  round is completed from the saved replicas and a fresh round starts from the outer model.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                            post_localSGD_hook)
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters
from torch.nn.parallel import DistributedDataParallel

from meshrun.train import dist
from meshrun.train.config import CommConfig, CommHook, WireDtype
from meshrun.train.diloco import DiLoCo, DiLoCoSettings, Route, fold, local_mean
from meshrun.train.loop import MicroStep
from meshrun.train.sites import Sites

FORMAT = 1
DILOCO_HOOKS = (CommHook.DILOCO, CommHook.DILOCO_OVERLAP)  # replicas apart for a whole round
OUTER_HOOKS = (*DILOCO_HOOKS, CommHook.HIER)  # an outer model and optimizer (train.diloco)
WIRE_DTYPES = {WireDtype.FP32: torch.float32, WireDtype.BF16: torch.bfloat16}


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
                 averager: PeriodicModelAverager | None = None,
                 diloco: DiLoCo | None = None,
                 optimizer: torch.optim.Optimizer | None = None, sites: Sites | None = None,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        self.hook, self.world_size, self.model = hook, world_size, model
        self.powersgd, self.localsgd, self.averager = powersgd, localsgd, averager
        self.diloco, self.optimizer = diloco, optimizer  # DiLoCo's inner one, or local SGD's
        # fp16's loss scaler, per rank under an outer hook or local SGD: each sees its own overflows.
        self.scaler = scaler
        self.sites = sites
        # The ranks DDP averages over when not all (hier: the site), for train.loop.micro_steps.
        self.peers: tuple[int, ...] | None = sites.ranks if sites is not None else None

    def _local_state(self) -> dict[str, Any]:
        # Replicas, optimizers (momentum) and loss scalers differ between syncs: each rank's goes in.
        if self.optimizer is None:
            return self._hook_state()
        mine = self.diloco.rank_state() if self.diloco is not None else self._hook_state()
        return {**mine, **self._own_optimizer()}

    def _hook_state(self) -> dict[str, Any]:
        """The hook's counters and memories: what a probe may change (``preserved``)."""
        if self.powersgd is not None:
            # torch's own picklable form: every slot except the process group.
            with _quiet():
                return {"powersgd": self.powersgd.__getstate__()}
        if self.localsgd is not None and self.averager is not None:
            return {"localsgd_iter": self.localsgd.iter, "averager_step": self.averager.step}
        return {}

    def _own_optimizer(self) -> dict[str, Any]:
        assert self.optimizer is not None
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scaler": scaler}

    def state_dict(self) -> dict[str, Any]:
        """Collective: ``{"format", "hook", "world_size", "ranks": [state of rank r, ...]}``."""
        ranks = dist.all_gather_objects(self._local_state()) if self.model is not None else [{}]
        out = {"format": FORMAT, "hook": self.hook.value, "world_size": self.world_size,
               "ranks": ranks}
        if self.diloco is not None:
            out["diloco"] = self.diloco.shared_state()  # the same on every rank: saved once
        if self.sites is not None:
            out["sites"] = list(self.sites.keys)  # per rank
        return out

    def same_on_every_host(self, snapshot: dict[str, Any], module: nn.Module) -> None:
        """DiLoCo, hier and local SGD: the top level of a checkpoint (``snapshot``, with
        ``state_dict()`` as its "comm") made the same on every rank, so that each host's copy is
        byte-identical without the checkpoint layer's fallback, a broadcast of rank 0's whole file
        to every writer at every save (~27 MB, 11 s at 20 Mbit/s, at every epoch end of the P9
        job): each rank's optimizer differs, and under fp16 each loss scaler, and mid-round each
        DiLoCo replica. A resume at the same world size loads each rank's from "comm"; the top
        level holds rank 0's optimizer and scaler (what the ranks of a resume at another world
        size start from) and DiLoCo's outer parameters (the anchor's tensors, saved once)."""
        if self.optimizer is None or self.model is None:
            return  # as _local_state: without an own optimizer no rank's state is gathered
        comm = snapshot["comm"]
        if self.diloco is not None:
            names = [name for name, p in module.named_parameters() if p.requires_grad]
            snapshot["model"] = {**snapshot["model"], **dict(zip(names, comm["diloco"]["anchor"]))}
        snapshot["optimizer"] = comm["ranks"][0]["optimizer"]
        if self.scaler is not None:
            snapshot["scaler"] = comm["ranks"][0]["scaler"]

    def load_rank_state(self, state: dict[str, Any]) -> None:
        """``state`` as loaded: checkpoints and gathered states come back on the CPU."""
        if self.powersgd is not None and "powersgd" in state:
            group = self.powersgd.process_group
            with _quiet():
                self.powersgd.__setstate__(_tensors_to(state["powersgd"], self._device()))
            self.powersgd.process_group = group
        if self.localsgd is not None and self.averager is not None and "localsgd_iter" in state:
            self.localsgd.iter = state["localsgd_iter"]
            self.averager.step = state["averager_step"]
        if self.diloco is not None and self.optimizer is not None and "samples" in state:
            self.diloco.load_rank(state)
        if self.optimizer is not None and state.get("optimizer") is not None:  # older: none
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler") is not None:
                self.scaler.load_state_dict(state["scaler"])  # its own, over rank 0's top level

    def _device(self) -> torch.device:
        """Where the model's gradients are, and with them the hook's state."""
        param = next(self.model.parameters(), None) if self.model is not None else None
        return param.device if param is not None else torch.device("cpu")

    def consensus(self) -> None:
        """Parameters drift apart between syncs: average them now (local SGD) or end the round
        with an outer step (DiLoCo). Collective."""
        if self.averager is not None and self.model is not None:
            average_parameters(self.model.parameters(), self.averager.process_group)
        if self.diloco is not None:
            self.diloco.flush()

    def before_save(self) -> None:
        """Local SGD saves the averaged model; DiLoCo saves every replica as it is, so a
        checkpoint does not change its rounds (collective). Hier on one site: the round's end
        changes only the anchor, which then holds the model a resume on several sites needs."""
        if self.averager is not None and self.model is not None:
            self.consensus()
        if self.diloco is not None and self.diloco.settings.single:
            self.diloco.flush()

    def stepped(self, samples: int) -> None:
        """After each optimizer step, skipped by fp16's scaler or not, with this rank's real
        samples in it (DiLoCo's weight). Collective on the steps that communicate."""
        if self.averager is not None and self.model is not None:
            # torch's averager.average_parameters, over every trainable parameter: it takes only
            # those with a gradient, none after zero_grad.
            due = self.averager.step - self.averager.warmup_steps
            if due >= 0 and due % self.averager.period == 0:
                average_parameters(iter([p for p in self.model.parameters() if p.requires_grad]),
                                   self.averager.process_group)
            self.averager.step += 1
        if self.diloco is not None:
            self.diloco.stepped(samples)

    def scaled(self, plan: list[MicroStep]) -> list[MicroStep]:
        """DiLoCo's inner steps use each rank's own mean loss; the others the global one (hier:
        the site's, through ``peers``)."""
        return local_mean(plan) if self.diloco is not None and self.sites is None else plan

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over every rank, in place (collective): on hier by the sites'
        route, which crosses the slow link once instead of a ring's several times."""
        if self.sites is not None:  # the route is the identity without a process group
            return self.sites.route.sum(values)
        return dist.all_reduce_sum(values)

    def _steady(self) -> None:
        """Past the warm-up, so a probe times what the hook sends in steady state."""
        if self.powersgd is not None:
            self.powersgd.iter = max(self.powersgd.iter, self.powersgd.start_powerSGD_iter)
        if self.localsgd is not None:
            self.localsgd.iter = max(self.localsgd.iter, self.localsgd.start_localSGD_iter)

    @contextlib.contextmanager
    def preserved(self) -> Iterator[None]:
        """Run the body (e.g. the comm timing probe) and put the hook state back afterwards, so
        probe steps neither count towards ``start_iter`` nor leave error feedback behind. The
        probe takes no optimizer step: DiLoCo's state and the optimizer's stay as they are."""
        saved = copy.deepcopy(self._hook_state())  # {} for DiLoCo: nothing to put back
        self._steady()
        try:
            yield
        finally:
            self.load_rank_state(saved)


def _tensors_to(state: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """PowerSGD's state with the tensors of its dicts (error feedback, P and Q memories, by
    bucket) on ``device``: its hook adds them to the bucket's gradients in place."""
    return {key: {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
            if isinstance(value, dict) else value for key, value in state.items()}


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
           world_size: int, saved: SavedComm | None, log: Callable[[str], None],
           sites: Sites | None = None, scaler: torch.amp.GradScaler | None = None) -> Communicator:
    """Register ``cfg.hook`` on the DDP ``model`` and restore its saved state when it applies;
    ``hier`` needs ``sites`` (``train.sites.build``), over whose site group ``model`` runs.
    ``scaler``: fp16's, which an outer hook's checkpoint state holds per rank."""
    if not dist.active() or cfg.hook is CommHook.NONE:
        _fold_saved(_module(model), cfg.hook, saved, log)
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
    elif cfg.hook in OUTER_HOOKS:
        comm = _attach_diloco(model, optimizer, cfg, world_size, sites, scaler)
    else:
        # Between averages each rank steps on its own gradients (no intra-host all-reduce:
        # torch's default subgroup is per CUDA device count, meaningless on CPU hosts).
        state = PostLocalSGDState(process_group=None, subgroup=None,
                                  start_localSGD_iter=cfg.start_iter,
                                  post_local_gradient_allreduce=False)
        model.register_comm_hook(state, post_localSGD_hook)
        averager = PeriodicModelAverager(period=cfg.localsgd_period, warmup_steps=cfg.start_iter)
        comm = Communicator(cfg.hook, world_size, model, localsgd=state, averager=averager,
                            optimizer=optimizer, scaler=scaler)  # averaged in stepped()
    _restore(comm, rank, saved, log)
    return comm


def _attach_diloco(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: CommConfig,
                   world_size: int, sites: Sites | None,
                   scaler: torch.amp.GradScaler | None) -> Communicator:
    """torch's no-communication hook for the inner steps (hier: DDP's own all-reduce inside the
    site); the outer model starts from the (restored, broadcast) parameters DDP holds now."""
    hier = cfg.hook is CommHook.HIER
    if hier and sites is None:
        raise ValueError("comm.hook=hier needs the sites (train.sites.build) and a DDP model over them")
    if not hier:
        model.register_comm_hook(None, debugging_hooks.noop_hook)
    settings = DiLoCoSettings(cfg.diloco_inner_steps, cfg.diloco_outer_lr,
                              cfg.diloco_outer_momentum, cfg.diloco_nesterov,
                              overlap=cfg.hook in (CommHook.DILOCO_OVERLAP, CommHook.HIER),
                              wire=WIRE_DTYPES[cfg.diloco_wire_dtype],
                              single=hier and sites is not None and sites.single)
    diloco = DiLoCo(model.module, settings, sites.route if hier and sites is not None else Route())
    return Communicator(cfg.hook, world_size, model, diloco=diloco, optimizer=optimizer,
                        sites=sites if hier else None, scaler=scaler)


def _restore(comm: Communicator, rank: int, saved: SavedComm | None,
             log: Callable[[str], None]) -> None:
    if saved is None or saved.state is None:
        return
    before = saved.state.get("hook", CommHook.NONE.value)
    shared = saved.state.get("diloco")  # an outer hook's, saved under a process group
    if comm.diloco is not None and shared is not None:
        _restore_outer(comm, comm.diloco, rank, saved, log)
    elif shared is not None:  # a flat hook now: the outer model becomes the model
        assert comm.model is not None  # attach made the hook with its DDP model
        _fold_saved(_module(comm.model), comm.hook, saved, log)
    elif before != comm.hook.value:
        log(f"comm: checkpoint was saved with comm.hook={before}, now {comm.hook.value}: "
            "the hook starts with a fresh state")
    elif comm.diloco is not None:  # the same outer hook, saved without a process group
        log(f"comm: checkpoint was saved with comm.hook={before} in a single process (no outer "
            "state): the outer model starts from the checkpoint's model")
    elif saved.world_size != comm.world_size:  # local SGD: the top level's, rank 0's optimizer
        what = "its warm-up starts over; every rank continues from rank 0's optimizer state" \
            if comm.localsgd is not None else "per-rank error feedback and warm-up start over"
        log(f"comm: world size changed ({saved.world_size} -> {comm.world_size}): "
            f"{comm.hook.value} hook state reset ({what})")
    else:
        comm.load_rank_state(saved.state["ranks"][rank])
        if comm.hook in (CommHook.POWERSGD, CommHook.LOCALSGD):
            log(f"comm: {comm.hook.value} hook state restored from the checkpoint")


def _restore_outer(comm: Communicator, diloco: DiLoCo, rank: int, saved: SavedComm,
                   log: Callable[[str], None]) -> None:
    """An outer hook's saved state under an outer hook: each rank's own back when nothing moved,
    else the interrupted round completed from every saved replica (``_why_completed``)."""
    assert saved.state is not None
    why = _why_completed(comm, saved)
    if why is None:  # first: a replica saved at a round's start is the anchor
        changed = diloco.load_shared(saved.state["diloco"])
        comm.load_rank_state(saved.state["ranks"][rank])
        log(f"comm: {comm.hook.value} hook state restored from the checkpoint")
    else:
        changed = diloco.restore_other_world(saved.state["diloco"], saved.state["ranks"])
        log(f"comm: {why}: {comm.hook.value} outer state restored; the interrupted round was "
            f"completed from the {saved.world_size} saved replicas and a new round starts from "
            "the outer model")
    if changed:
        log(f"comm: outer optimizer {', '.join(changed)}: the config's settings replace the "
            "checkpoint's")


def _why_completed(comm: Communicator, saved: SavedComm) -> str | None:
    """Why no rank can take its own replica back (None: each can)."""
    assert saved.state is not None and comm.diloco is not None
    before = saved.state.get("hook", CommHook.NONE.value)
    if before != comm.hook.value:
        return f"checkpoint was saved with comm.hook={before}, now {comm.hook.value}"
    if saved.world_size != comm.world_size:
        return f"world size changed ({saved.world_size} -> {comm.world_size})"
    if _moved(comm, saved):
        return "the ranks' sites changed"
    if comm.diloco.settings.single:  # a round in flight has nowhere to land: no outer step here
        return "one site, plain DDP"
    return None


def _fold_saved(module: nn.Module, now: CommHook, saved: SavedComm | None,
                log: Callable[[str], None]) -> None:
    """A saved outer state under a hook with no outer model: its rounds completed into
    ``module`` (``diloco.fold``), not dropped with the samples the position counts as done."""
    if saved is None or saved.state is None or saved.state.get("diloco") is None:
        return
    shared = saved.state["diloco"]
    fold(module, shared, saved.state["ranks"])
    where = f"comm.hook={now.value}" if dist.active() else "a single process"
    log(f"comm: checkpoint was saved with comm.hook={saved.state.get('hook')}, now {where}: its "
        f"interrupted round was completed from the {saved.world_size} saved replicas into the model")


def _module(model: nn.Module) -> nn.Module:
    """The module a DDP model wraps (the model itself without a process group)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _moved(comm: Communicator, saved: SavedComm) -> bool:
    """hier: a rank's replica belongs to its site; with other sites, no rank can take its own back."""
    return comm.sites is not None and saved.state is not None and \
        list(saved.state.get("sites", ())) != list(comm.sites.keys)


def gradient_shapes(module: nn.Module) -> list[list[int]]:
    """Shapes of the parameters DDP all-reduces (those that take gradients)."""
    return [list(p.shape) for p in module.parameters() if p.requires_grad]


__all__ = ["DILOCO_HOOKS", "OUTER_HOOKS", "SavedComm", "Communicator", "attach", "gradient_shapes"]
