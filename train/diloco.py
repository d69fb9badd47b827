"""DiLoCo (Douillard et al. 2023): local inner steps, then an outer Nesterov step on the
sample-weighted pseudo-gradient; optionally overlapped, with the outer update one round late.

Contract:
- Inner steps communicate nothing: ``train.comm`` registers torch's ``noop_hook`` on the DDP
  model, so DDP's backward leaves each rank's own gradient (not divided by the world size), and
  ``local_mean`` scales each rank's loss to its own mean over its real samples.
- ``DiLoCo.stepped(samples)`` after every inner optimizer step counts this rank's real samples;
  after ``inner_steps`` steps (one round) it syncs. The pseudo-gradient of rank i is
  ``anchor - params_i`` (anchor: the parameters at the last sync, i.e. the outer model); one
  ``torch.distributed.all_reduce`` of ``[w_i * delta_i, w_i]`` (``w_i``: samples since the last
  sync) gives ``g = sum_i w_i delta_i / sum_i w_i``; ``torch.optim.SGD(nesterov=True)`` steps
  the anchor with ``g`` as its gradient, and every rank continues from the new anchor.
  Floating buffers (BatchNorm statistics) are averaged with the same weights in the same call.
- Overlapped (``overlap=True``): at the end of round t the all-reduce of round t starts with
  ``async_op=True``; the one of round t-1 is waited for and applied to the anchor, and every
  rank continues from that anchor. Round t's local progress is thus dropped locally and reaches
  the model one round late, through the outer step at the end of round t+1 (one-step-delay
  DiLoCo: the reduce of round t runs while round t+1 computes).
- Where the all-reduce runs is a ``Route``: flat (the default), one all-reduce over every rank;
  hierarchical (``comm.hook=hier``, ``train.sites``), an all-reduce inside the rank's site (whose
  replicas DDP keeps identical, so the site's sum is ``W_site * delta_site``), then one across the
  sites' representatives (the overlapped part, the only traffic between sites), then a broadcast
  from the representative inside the site. Both give every rank the same sum over all ranks.
- ``comm.diloco_wire_dtype=bf16`` (``DiLoCoSettings.wire``): the pseudo-gradient part of that sum
  crosses as bfloat16 (cast, all-reduce, cast back: torch's ``bf16_compress_hook`` arithmetic), in
  half the bytes; the float buffers and the sample weight go beside it in fp32, so the weights
  stay exact. Hierarchical: only between sites (inside a site the sum stays fp32).
- One site (``DiLoCoSettings.single``, ``comm.hook=hier`` on one site): DDP already keeps every
  replica identical, so there is no outer step: at each round's end (and ``flush``) the anchor
  follows the model and nothing else changes; training is plain DDP. The outer state stays in
  checkpoints, so a resume on several sites starts its first round from exactly that model.
- ``flush()`` makes replicas identical (before evaluation, at the end of training): it applies
  the pending round, then syncs the partial current round synchronously. Rounds restart there.
- State for checkpoints is plain tensors, dicts and ints (``torch.load(weights_only=True)``):
  ``shared_state()`` (anchor, outer optimizer, inner-step counter, pending reduced buffer) is
  identical on every rank; each rank's own model, inner optimizer and sample count go
  separately (``train.comm``). ``restore_other_world`` completes an interrupted round from
  every saved replica when the world size changed (a running sum: one saved replica's
  contribution at a time on the device, where the model, both optimizers and DDP's buckets
  already are); ``fold`` does the same into a module whose new hook has no outer model.
- The outer optimizer's settings are the config's: a resumed ``load_state_dict`` would bring back
  the saved lr, momentum and Nesterov flag; ``load_shared`` puts the config's back and returns
  what it changed (a momentum now 0 also drops the saved momentum buffer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as torch_dist
from torch import nn

from meshrun.train import dist
from meshrun.train.loop import MicroStep


@dataclass(frozen=True)
class InFlight:
    """An outer all-reduce begun by ``Route.start``: summing ``buf`` in place, or, sent narrow,
    its first ``len(narrow)`` elements as ``narrow`` (copied back by ``Route.finish``)."""

    buf: torch.Tensor
    works: tuple[torch_dist.Work, ...] = ()
    narrow: torch.Tensor | None = None


@dataclass(frozen=True)
class Route:
    """Process groups of the outer all-reduce; all None: flat, over the default group."""

    site: torch_dist.ProcessGroup | None = None  # this rank's site (hierarchical)
    cross: torch_dist.ProcessGroup | None = None  # the sites' representatives; None elsewhere
    root: int = 0  # global rank of this site's representative

    def start(self, buf: torch.Tensor, async_op: bool, narrow: int = 0,
              wire: torch.dtype = torch.float32) -> InFlight:
        """Begin summing ``buf`` in place over every rank; the part between sites may run on.
        ``narrow``: that many leading elements (the pseudo-gradient) cross as ``wire``."""
        if not dist.active():
            return InFlight(buf)
        if self.site is None:
            return _all_reduce(buf, None, async_op, narrow, wire)
        torch_dist.all_reduce(buf, group=self.site)  # inside the site: exact, on the LAN
        if self.cross is not None:
            return _all_reduce(buf, self.cross, async_op, narrow, wire)
        return InFlight(buf)

    def finish(self, flight: InFlight) -> torch.Tensor:
        """Wait for ``start``'s work; hierarchical: the representative's sum reaches its site."""
        for work in flight.works:
            work.wait()
        buf = flight.buf
        if flight.narrow is not None:
            buf[:flight.narrow.numel()].copy_(flight.narrow)
        if self.site is not None and dist.active():
            torch_dist.broadcast(buf, src=self.root, group=self.site)
        return buf

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` over every rank now, in place, by this route (collective). For small
        tensors on a hierarchical route this costs the slow link one all-reduce between two
        sites' representatives instead of a ring over every rank that crosses it several times
        (3 ranks, 2 + 1 sites, 4 f64 measured on the test bed: 82 ms instead of 122 ms at 40 ms
        RTT, 303 instead of 453 ms at 150 ms)."""
        return self.finish(self.start(values, async_op=False))


def _all_reduce(buf: torch.Tensor, group: torch_dist.ProcessGroup | None, async_op: bool,
                narrow: int, wire: torch.dtype) -> InFlight:
    """torch's all-reduce of ``buf``; with a narrower ``wire`` dtype, the same arithmetic as
    torch's ``bf16_compress_hook`` on the first ``narrow`` elements (cast, sum, cast back), and
    the rest (float buffers, the sample weight: exact totals) in a second all-reduce beside it."""
    if narrow == 0 or wire == buf.dtype:
        work = torch_dist.all_reduce(buf, group=group, async_op=async_op)
        return InFlight(buf, (work,) if work is not None else ())
    head = buf[:narrow].to(wire)
    works = [torch_dist.all_reduce(part, group=group, async_op=async_op) for part in (head, buf[narrow:])]
    return InFlight(buf, tuple(w for w in works if w is not None), head)


@dataclass(frozen=True)
class DiLoCoSettings:
    inner_steps: int  # H: inner optimizer steps per round
    outer_lr: float
    outer_momentum: float
    nesterov: bool  # torch's Nesterov needs momentum > 0; ignored at momentum 0
    overlap: bool  # one-round-late outer update, all-reduce in the background
    wire: torch.dtype = torch.float32  # the pseudo-gradient's dtype on the outer all-reduce
    single: bool = False  # one site (hier): plain DDP, the anchor follows the model, no outer step


def local_mean(plan: Sequence[MicroStep]) -> list[MicroStep]:
    """The epoch's micro-steps with each loss scaled by ``1 / this rank's real samples`` of its
    optimizer step (own mean gradient: nothing divides by the world size, nothing averages
    ranks); a window where this rank has only padding gets 0 (its loss is empty anyway)."""
    out: list[MicroStep] = []
    window: list[MicroStep] = []
    for step in plan:
        window.append(step)
        if step.sync:
            mine = sum(w.real for w in window)
            out += [dataclasses.replace(w, scale=1.0 / mine if mine else 0.0) for w in window]
            window = []
    return out + window


def weighted_sum(anchor: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                 buffers: Sequence[torch.Tensor], samples: int) -> torch.Tensor:
    """One rank's all-reduce contribution: ``[w * (anchor - params), w * buffers, w]`` flat."""
    w = float(samples)
    device = anchor[0].device  # saved replicas arrive on the CPU
    parts = [(a - p.detach().to(device)).reshape(-1).float() * w for a, p in zip(anchor, params)]
    parts += [b.detach().to(device).reshape(-1).float() * w for b in buffers]
    return torch.cat([*parts, torch.tensor([w], device=device)])


class DiLoCo:
    """Outer model (anchor), outer optimizer and round bookkeeping for one rank."""

    def __init__(self, module: nn.Module, settings: DiLoCoSettings, route: Route = Route()) -> None:
        self.settings, self.route = settings, route
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.anchor = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(
            self.anchor, lr=settings.outer_lr, momentum=settings.outer_momentum,
            nesterov=settings.nesterov and settings.outer_momentum > 0)
        self.inner_step = 0  # inner steps in the current round (same on every rank)
        self.samples = 0  # this rank's real samples in the current round
        self._flight: InFlight | None = None
        self._pending: torch.Tensor | None = None  # overlap: the previous round's reduce buffer
        self._landed = True  # the pending buffer holds the sum over every rank

    def stepped(self, samples: int) -> None:
        """After one inner optimizer step with ``samples`` real samples on this rank."""
        self.inner_step += 1
        self.samples += samples
        if self.inner_step >= self.settings.inner_steps:
            self.sync()

    def sync(self) -> None:
        """End the round (collective): see the module docstring for both variants."""
        if self.settings.single:
            self._follow()
            return
        mine = weighted_sum(self.anchor, self.params, self.buffers, self.samples)
        if self.settings.overlap:
            flight = self._start(mine, async_op=True)
            self._apply_pending()
            self._flight, self._pending, self._landed = flight, mine, False
        else:
            self._apply(self._reduced(mine))
        self._restart()

    def _start(self, mine: torch.Tensor, async_op: bool) -> InFlight:
        narrow = sum(a.numel() for a in self.anchor)  # the pseudo-gradient; buffers and weight stay
        return self.route.start(mine, async_op, narrow, self.settings.wire)

    def _reduced(self, mine: torch.Tensor) -> torch.Tensor:
        return self.route.finish(self._start(mine, async_op=False))

    def flush(self) -> None:
        """Make every replica the outer model (collective): the pending round, then the
        partial current one."""
        if self.settings.single:
            self._follow()
            return
        if self._pending is None and self.inner_step == 0:
            return
        mine = weighted_sum(self.anchor, self.params, self.buffers, self.samples)
        self._apply_pending()
        if self.inner_step > 0:
            self._apply(self._reduced(mine))
        self._restart()

    def _apply_pending(self) -> None:
        reduced = self.wait()
        self._pending = None
        if reduced is not None:
            self._apply(reduced)

    def wait(self) -> torch.Tensor | None:
        """The previous round's reduced buffer (overlap), waiting for its all-reduce (collective
        on a hierarchical route: the sum is broadcast inside each site)."""
        if self._pending is not None and not self._landed:
            assert self._flight is not None
            self.route.finish(self._flight)
            self._flight, self._landed = None, True
        return self._pending

    @torch.no_grad()
    def _apply(self, reduced: torch.Tensor) -> None:
        """Outer step with ``g = sum w delta / sum w``; buffers become the weighted mean. No
        sample in the round (``sum w == 0``): a zero gradient, buffers kept. Decided on the
        device, not by ``.item()``: no wait for the GPU at every round."""
        total = reduced[-1]
        some = total > 0
        mean = torch.where(some, reduced[:-1] / total, 0.0)
        at = 0
        for a in self.anchor:
            a.grad = mean[at:at + a.numel()].view_as(a).to(a.dtype)
            at += a.numel()
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        for b in self.buffers:
            b.copy_(torch.where(some, mean[at:at + b.numel()].view_as(b), b))
            at += b.numel()

    @torch.no_grad()
    def _follow(self) -> None:
        """One site: every replica is already the model (DDP); the outer model becomes it too."""
        for a, p in zip(self.anchor, self.params):
            a.copy_(p)
        self.inner_step = self.samples = 0

    @torch.no_grad()
    def _restart(self) -> None:
        for p, a in zip(self.params, self.anchor):
            p.copy_(a)
        self.inner_step = self.samples = 0

    def shared_state(self) -> dict[str, Any]:
        """Identical on every rank; waits for a pending all-reduce (nothing changes by it)."""
        pending = self.wait()
        return {"anchor": [a.clone() for a in self.anchor], "outer": self.outer.state_dict(),
                "inner_step": self.inner_step,
                "pending": None if pending is None else pending.clone()}

    @torch.no_grad()
    def load_shared(self, state: dict[str, Any]) -> list[str]:
        """``state`` as loaded (checkpoints and gathered states come back on the CPU): the anchor
        is copied and the outer optimizer's state moved by ``load_state_dict``; the pending
        buffer is moved here, or its outer step would mix devices on a GPU. Returns the outer
        settings that the config changed from the checkpoint's (``_configured``)."""
        for a, saved in zip(self.anchor, state["anchor"]):
            a.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        changed = self._configured()
        self.inner_step = state["inner_step"]
        pending = state["pending"]
        if pending is not None:
            pending = pending.to(self.anchor[0].device)
        self._flight, self._pending, self._landed = None, pending, True
        return changed

    def _configured(self) -> list[str]:
        """The config's lr, momentum and Nesterov over the ones ``load_state_dict`` restored (a
        user who lowers the outer momentum of a diverging run gets it); ``["momentum 0.9 -> 0.0"]``."""
        s = self.settings
        want = {"lr": s.outer_lr, "momentum": s.outer_momentum,
                "nesterov": s.nesterov and s.outer_momentum > 0}
        changed = [f"{key} {self.outer.param_groups[0][key]} -> {value}" for key, value in want.items()
                   if self.outer.param_groups[0][key] != value]
        for group in self.outer.param_groups:
            group.update(want)
        if s.outer_momentum == 0:  # else a later resume with momentum would revive a stale buffer
            for state in self.outer.state.values():
                state.pop("momentum_buffer", None)
        return changed

    def rank_state(self) -> dict[str, Any]:
        """This rank's replica: its parameters and floating buffers, samples in the round. At a
        round's start (``inner_step == 0``: every epoch end, after the flush) each replica is the
        anchor, so ``params`` is None: the checkpoint gathers every rank's state to every rank,
        across the links between sites, and the anchor is already in ``shared_state``."""
        params = None if self.inner_step == 0 else [p.detach().clone() for p in self.params]
        return {"params": params, "buffers": [b.detach().clone() for b in self.buffers],
                "samples": self.samples}

    @torch.no_grad()
    def load_rank(self, state: dict[str, Any]) -> None:
        """After ``load_shared`` (a replica saved as None is the anchor)."""
        for p, saved in zip([*self.params, *self.buffers], [*self._replica(state), *state["buffers"]]):
            p.copy_(saved)
        self.samples = state["samples"]

    def _replica(self, state: dict[str, Any]) -> Sequence[torch.Tensor]:
        return self.anchor if state["params"] is None else state["params"]

    @torch.no_grad()
    def restore_other_world(self, shared: dict[str, Any], ranks: Sequence[dict[str, Any]]) -> list[str]:
        """At a new world size the saved replicas have no rank to go back to: finish their
        round here exactly as their all-reduce would have (same arithmetic on every new rank,
        so the replicas start identical), then start a fresh round from the outer model.
        Returns ``load_shared``'s changed settings."""
        changed = self.load_shared(shared)
        # Summed before the pending round moves the anchor: the replicas' deltas are from it.
        partial = self._saved_sum(ranks) if self.inner_step > 0 else None
        self._apply_pending()
        if partial is not None:
            self._apply(partial)
        self._restart()
        return changed

    def _saved_sum(self, ranks: Sequence[dict[str, Any]]) -> torch.Tensor:
        """What the round's all-reduce would have summed, one saved replica at a time: a stack
        of them held 2 x (saved ranks) x the model on the GPU (8 ranks of a 1.4 GB model: 22 GB)."""
        total: torch.Tensor | None = None
        for r in ranks:
            total = _accumulate(total, weighted_sum(self.anchor, self._replica(r), r["buffers"], r["samples"]))
        assert total is not None
        return total


def _accumulate(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """``total + part``, in place; a function, so no loop variable keeps the last part alive."""
    return part if total is None else total.add_(part)


def fold(module: nn.Module, shared: dict[str, Any], ranks: Sequence[dict[str, Any]]) -> None:
    """A saved outer state completed into ``module`` for a hook with no outer model (a flat hook,
    or one process): the pending and partial rounds applied by the saved outer optimizer, as the
    run that saved them would have, and the outer model copied into ``module``'s parameters."""
    group = shared["outer"]["param_groups"][0]
    settings = DiLoCoSettings(1, group["lr"], group["momentum"], group["nesterov"], overlap=False)
    DiLoCo(module, settings).restore_other_world(shared, ranks)


__all__ = ["InFlight", "Route", "DiLoCoSettings", "DiLoCo", "fold", "local_mean", "weighted_sum"]
