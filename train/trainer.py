"""The trainer: builds data, model, optimizer and outputs from a config, then runs epochs.

Contract:
- Construction is collective when a process group exists (it agrees on and loads the newest
  checkpoint held by any rank) and must happen after ``dist.init``.
- ``fit()`` trains up to ``cfg.epochs`` epochs from the restored position, evaluates exactly
  after each, checkpoints on rank 0 after each epoch and every ``checkpoint.every_steps``
  optimizer steps, and returns the final ``ResultRecord`` (also written to result.json).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, default_collate

from train import dist, perf, state
from train.checkpoint import Checkpointer, restore_agreed
from train.config import Precision, TrainConfig, to_dict
from train.data import build_datasets
from train.dist import DistEnv
from train.errors import InjectedFailure
from train.loop import EvalResult, StepParts, evaluate, forward_backward, optimizer_step
from train.metrics import (CommRecord, EpochRecord, MetricsSink, ProgressRecord, ResultRecord,
                           ResumeRecord, StepRecord)
from train.models import build_model
from train.optim import build_optimizer, lr_at, set_lr
from train.render import Console
from train.sampler import ResumableBatchSampler, WeightedDataset, eval_shard
from train.state import Position


def amp_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """AMP only on CUDA; on CPU the config value is ignored (and announced by the trainer)."""
    if device.type != "cuda" or precision is Precision.OFF:
        return None
    return torch.bfloat16 if precision is Precision.BF16 else torch.float16


class Trainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv, run_dir: Path, device: torch.device,
                 console: Console) -> None:
        self.cfg, self.env, self.device, self.console = cfg, env, device, console
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.data = build_datasets(cfg.data)
        self.module = build_model(cfg.model, self.data.num_classes, self.data.input_shape).to(device)
        optimizer = build_optimizer(cfg.optim, self.module.parameters())
        dtype = amp_dtype(cfg.amp, device)
        scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
        torch.manual_seed(cfg.seed + 1 + env.rank)  # per-rank stream: dropout, augmentation
        self.ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
        self.sink = MetricsSink(run_dir, env.rank, env.is_main, cfg.log.progress_seconds,
                                cfg.log.tensorboard)
        self.pos = Position()
        self._restored = self._restore(optimizer, scaler)
        model = self.module
        if dist.active():
            ids = [device.index] if device.type == "cuda" else None
            model = DistributedDataParallel(self.module, device_ids=ids)
        self.parts = StepParts(model, optimizer, scaler, dtype, device, cfg.optim.grad_clip)
        self.sampler = ResumableBatchSampler(len(self.data.train), cfg.data.batch_size,
                                             env.world_size, env.rank, cfg.seed)
        self.loader_seed = torch.Generator()  # keeps the global RNG untouched by DataLoader
        self.train_loader = DataLoader(WeightedDataset(self.data.train), batch_sampler=self.sampler,
                                       num_workers=cfg.data.num_workers, generator=self.loader_seed,
                                       pin_memory=device.type == "cuda")
        shard = Subset(self.data.test, eval_shard(len(self.data.test), env.world_size, env.rank))
        self.test_loader = DataLoader(shard, batch_size=cfg.data.eval_batch_size,
                                      num_workers=cfg.data.num_workers)

    def _restore(self, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None) -> state.Restored | None:
        if not self.cfg.checkpoint.resume:
            return None
        saved = restore_agreed(self.ckpt, self.env.rank, self.device)
        if saved is None:
            return None
        restored = state.apply(saved, self.module, optimizer, scaler, self.cfg.seed,
                               self.env.rank, self.env.world_size)
        self.pos = restored.position
        return restored

    def fit(self) -> ResultRecord:
        self._announce()
        if self.pos.epoch < self.cfg.epochs:
            self._probe_comm()
        for epoch in range(self.pos.epoch, self.cfg.epochs):
            started = time.time()
            self._train_epoch(epoch)
            train_s, started = time.time() - started, time.time()
            result = evaluate(self.module, self.test_loader, self.device, self.parts.autocast_dtype)
            self._end_epoch(epoch, result, train_s, time.time() - started)
        final = ResultRecord(
            epochs_completed=self.pos.epoch,
            metrics={"test_acc": self.pos.last_test_acc, "test_loss": self.pos.last_test_loss},
            best_test_acc=self.pos.best_acc, world_size=self.env.world_size,
            restarts=self.env.restart_count, global_step=self.pos.global_step)
        self.sink.result(final)
        return final

    def close(self) -> None:
        self.sink.close()

    def _announce(self) -> None:
        resolved = to_dict(self.cfg)
        self.sink.config(resolved)
        self.console.line("resolved config:\n" + yaml.safe_dump(resolved, sort_keys=False).rstrip())
        if self.cfg.amp is not Precision.OFF and self.parts.autocast_dtype is None:
            self.console.line(f"amp={self.cfg.amp.value} ignored: AMP runs only on CUDA")
        r = self._restored
        if r is not None:
            self.sink.event(ResumeRecord(
                from_step=r.position.global_step, epoch=r.position.epoch,
                world_size=self.env.world_size, saved_world_size=r.saved_world_size,
                consumed_in_epoch=r.position.consumed, source_rank=r.source_rank, time=time.time()))
            self.console.line(f"resumed from step {r.position.global_step} (epoch {r.position.epoch}"
                              f" + {r.position.consumed} samples), checkpoint from rank "
                              f"{r.source_rank}, saved at world size {r.saved_world_size}")

    def _probe_comm(self) -> None:
        steps = self.cfg.perf.comm_probe_steps
        if not dist.active() or steps <= 0:
            return
        size = min(self.cfg.data.batch_size, len(self.data.train))
        weighted = WeightedDataset(self.data.train)
        batch = default_collate([weighted[(i, 1.0 / size)] for i in range(size)])
        est = perf.probe_comm(self.parts, tuple(batch), steps)
        self.sink.rank_record(CommRecord(
            rank=self.env.rank, host=self.env.host, method=est.method, steps=est.steps,
            sync_s=est.sync_s, no_sync_s=est.no_sync_s, comm_s=est.comm_s,
            world_size=self.env.world_size, time=time.time()))
        self.console.line(f"comm probe: {est.comm_s * 1e3:.2f} ms/step of gradient all-reduce "
                          f"({est.sync_s * 1e3:.2f} synced vs {est.no_sync_s * 1e3:.2f} no_sync)")

    def _train_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch, self.pos.consumed)
        self.loader_seed.manual_seed(hash((self.cfg.seed, epoch, self.pos.consumed, self.env.rank)))
        steps = self.sampler.steps
        full = self.env.world_size * self.cfg.data.batch_size
        per_epoch = math.ceil(len(self.data.train) / full)
        offset = math.ceil(self.pos.consumed / full)
        accum = self.cfg.optim.accum_steps
        self.console.start_epoch(epoch, len(steps), offset)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        timer = _StepTimer(self.device, self._records(self.pos.global_step + 1))
        for i, (x, y, w) in enumerate(self.train_loader):
            timer.data_ready()
            window = min(accum, len(steps) - (i // accum) * accum)
            last = (i + 1) % accum == 0 or i + 1 == len(steps)
            ls, c = forward_backward(self.parts, x.to(self.device, non_blocking=True),
                                     y.to(self.device, non_blocking=True),
                                     w.to(self.device, non_blocking=True), 1.0 / window, last)
            loss_sum += ls
            count += c
            self.pos = dataclasses.replace(self.pos, consumed=self.pos.consumed + steps[i].real,
                                           samples_seen=self.pos.samples_seen + steps[i].real)
            timer.computed()
            if not last:
                continue
            lr = lr_at(self.cfg.schedule, self.cfg.optim.lr,
                       epoch + self.pos.consumed / len(self.data.train), self.cfg.epochs)
            set_lr(self.parts.optimizer, lr)
            optimizer_step(self.parts)
            self.pos = dataclasses.replace(self.pos, global_step=self.pos.global_step + 1)
            self._after_step(epoch, i, timer, int(sum(s.real for s in steps[i + 1 - window:i + 1])),
                             loss_sum, count, offset, per_epoch, done_all=i + 1 == len(steps))
        totals = dist.all_reduce_sum(torch.stack([loss_sum, count]))
        self.pos = dataclasses.replace(
            self.pos, epoch_loss_sum=self.pos.epoch_loss_sum + float(totals[0]),
            epoch_loss_count=self.pos.epoch_loss_count + int(totals[1]))
        self.console.end_epoch()

    def _after_step(self, epoch: int, i: int, timer: "_StepTimer", global_real: int,
                    loss_sum: torch.Tensor, count: torch.Tensor, offset: int, per_epoch: int,
                    done_all: bool) -> None:
        gs = self.pos.global_step
        if timer.recording:
            self.sink.rank_record(timer.record(self.env, epoch, gs, global_real))
        timer.restart(self._records(gs + 1))
        done = offset + i + 1
        show = done % max(self.cfg.log.print_every_steps, 1) == 0 or done_all
        self.console.step(done, float(loss_sum / count.clamp(min=1)) if show else None)
        self.sink.progress(ProgressRecord(epoch, done, per_epoch, gs, self.env.world_size,
                                          time.time()))
        if self.ckpt.due(gs) and not done_all:
            partial = dist.all_reduce_sum(torch.stack([loss_sum, count]))
            self._save(is_best=False, pos=dataclasses.replace(
                self.pos, epoch_loss_sum=self.pos.epoch_loss_sum + float(partial[0]),
                epoch_loss_count=self.pos.epoch_loss_count + int(partial[1])))
            if self.cfg.debug.stop_after_step == gs:
                raise InjectedFailure(f"debug.stop_after_step={gs}: stopping after checkpoint")

    def _end_epoch(self, epoch: int, result: EvalResult, train_s: float, eval_s: float) -> None:
        train_loss = self.pos.epoch_loss_sum / max(self.pos.epoch_loss_count, 1)
        is_best = result.top1 > self.pos.best_acc or epoch == 0
        self.pos = dataclasses.replace(
            self.pos, epoch=epoch + 1, consumed=0, epoch_loss_sum=0.0, epoch_loss_count=0,
            best_acc=max(self.pos.best_acc, result.top1), last_test_acc=result.top1,
            last_test_loss=result.loss)
        self._save(is_best)
        lr = self.parts.optimizer.param_groups[0]["lr"]
        record = EpochRecord(epoch + 1, train_loss, result.loss, result.top1, result.top5, lr,
                             self.env.world_size, self.pos.global_step, time.time(),
                             self.pos.samples_seen, train_s, eval_s)
        self.sink.event(record)
        self.sink.flush()
        self.sink.scalars({"train/loss": train_loss, "test/loss": result.loss,
                           "test/acc1": result.top1, "test/acc5": result.top5, "lr": lr},
                          self.pos.global_step)
        self.sink.progress(ProgressRecord(epoch + 1, 0, self.sampler_steps_per_epoch(),
                                          self.pos.global_step, self.env.world_size, time.time()),
                           force=True)
        self.console.line(f"epoch {epoch + 1}/{self.cfg.epochs} train_loss {train_loss:.4f} "
                          f"test_loss {result.loss:.4f} acc1 {result.top1:.4f} "
                          f"acc5 {result.top5:.4f} lr {lr:.5g} ({train_s:.1f}s train)")
        if self.cfg.debug.stop_after_epoch == epoch + 1:
            raise InjectedFailure(f"debug.stop_after_epoch={epoch + 1}: stopping after checkpoint")

    def _records(self, step: int) -> bool:
        return step % max(self.cfg.perf.every_steps, 1) == 0

    def sampler_steps_per_epoch(self) -> int:
        return math.ceil(len(self.data.train) / (self.env.world_size * self.cfg.data.batch_size))

    def _save(self, is_best: bool, pos: Position | None = None) -> None:
        """Collective (RNG gather); rank 0 writes. ``pos`` overrides the saved position."""
        pos = pos or self.pos
        lr = self.parts.optimizer.param_groups[0]["lr"]
        snapshot = state.capture(self.cfg, self.module, self.parts.optimizer, self.parts.scaler,
                                 pos, lr, self.env.world_size, self.env.is_main)
        if snapshot is not None:
            self.ckpt.save(snapshot, pos.global_step, is_best)


class _StepTimer:
    """Splits one optimizer step's wall time into data wait, fwd+bwd and optimizer phases."""

    def __init__(self, device: torch.device, recording: bool) -> None:
        self.device, self.recording = device, recording
        self.watch = perf.Stopwatch()
        self.data_s = self.fwd_bwd_s = 0.0

    def data_ready(self) -> None:
        self.data_s += self.watch.lap()

    def computed(self) -> None:
        if self.recording:
            perf.sync(self.device)
        self.fwd_bwd_s += self.watch.lap()

    def record(self, env: DistEnv, epoch: int, step: int, global_real: int) -> StepRecord:
        perf.sync(self.device)
        optim_s = self.watch.lap()
        step_s = self.data_s + self.fwd_bwd_s + optim_s
        mine = global_real / env.world_size
        mem = perf.peak_memory(self.device)
        return StepRecord(env.rank, env.host, epoch, step, int(mine), self.data_s, self.fwd_bwd_s,
                          optim_s, step_s, mine / step_s, global_real / step_s, mem.bytes,
                          mem.kind, time.time())

    def restart(self, recording: bool) -> None:
        self.recording = recording
        self.watch.lap()
        self.data_s = self.fwd_bwd_s = 0.0
