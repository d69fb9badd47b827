"""The trainer: builds data, model, optimizer and outputs from a config, then runs epochs.

Contract:
- Construction is collective when a process group exists (it agrees on and loads the newest
  checkpoint held by any rank, and under ``amp: fp16`` on the loss scaler: ``train.amp``, every
  rank or none) and must happen after ``dist.init``.
- Construction also resolves the per-rank batch sizes (``train.balance``, collective; it runs
  the ``batch_size: auto`` probe when asked, on plain BatchNorm: ``sync_bn`` converts it after,
  over DDP's process group) and lays out each epoch with them.
- ``fit()`` trains up to ``cfg.epochs`` epochs from the restored position, evaluates exactly
  after each, checkpoints (a copy per host) after each epoch and every ``checkpoint.every_steps``
  optimizer steps, and returns the final ``ResultRecord`` (also written to result.json).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, default_collate

from meshrun.layout import CHECKPOINTS, launch_rdzv_id
from meshrun.train import amp, balance, dist, perf, seeds, state
from meshrun.train import comm, sites, wandblog
from meshrun.train.checkpoint import Checkpointer, open_site, restore_agreed
from meshrun.train.amp import amp_dtype
from meshrun.train.config import CommHook, TrainConfig, to_dict
from meshrun.train.data import build_datasets
from meshrun.train.dist import DistEnv
from meshrun.train.errors import InjectedFailure
from meshrun.train.loop import (EvalResult, StepParts, evaluate, forward_backward, micro_steps,
                        optimizer_step)
from meshrun.train.metrics import (BalanceRecord, CommRecord, EpochRecord, MetricsSink, ProgressRecord,
                           ResultRecord, ResumeRecord)
from meshrun.train.models import build_model
from meshrun.train.optim import build_optimizer, set_lr, step_lr
from meshrun.train.render import Console
from meshrun.train.replicas import adopt_rank0_buffers, check_sync_bn, convert_sync_bn
from meshrun.train.sampler import IndexedDataset, ResumableBatchSampler, eval_shard, steps_per_epoch
from meshrun.train.starts import count_start
from meshrun.train.state import Position
from meshrun.train.tally import EpochTally, EpochTotals


@dataclass
class Cursor:
    """The position counters that move every step (plain ints: no record is rebuilt per step)."""

    consumed: int
    samples_seen: int
    global_step: int
    mine: int = 0  # this rank's real samples since the last optimizer step


class Trainer:
    def __init__(self, cfg: TrainConfig, env: DistEnv, run_dir: Path, device: torch.device,
                 console: Console) -> None:
        self.cfg, self.env, self.device, self.console = cfg, env, device, console
        torch.manual_seed(seeds.derive(cfg.seed, seeds.INIT))  # identical initial weights on every rank
        self.data = build_datasets(cfg.data)
        self.module = build_model(cfg.model, self.data.num_classes, self.data.input_shape).to(device)
        check_sync_bn(cfg.sync_bn, device)
        optimizer = build_optimizer(cfg.optim, self.module.parameters())
        dtype = amp_dtype(cfg.amp, device)
        scaler = amp.setup(cfg.amp, dtype, device, env.rank, env.host)  # the job's: every rank or none
        torch.manual_seed(seeds.derive(cfg.seed, seeds.RANK, env.rank))  # dropout, augmentation
        ckpt_dir = run_dir / CHECKPOINTS
        self.ckpt = Checkpointer(ckpt_dir, cfg.checkpoint,
                                 open_site(ckpt_dir, env.rank, env.host, device))
        self.sink = MetricsSink(run_dir, env.rank, env.is_main, cfg.log.progress_seconds,
                                cfg.log.tensorboard)
        # Every start of the worker group, whatever caused it (summary.json's `restarts`).
        self.starts = count_start(run_dir, launch_rdzv_id(env.rdzv_id), env.local_rank == 0, device)
        self.pos = Position()
        self._comm_saved: comm.SavedComm | None = None  # set by _restore
        self._restored = self._restore(optimizer, scaler)
        # A fresh start (nothing restored, the launch's first start: a restart of this launch before its first
        # checkpoint keeps its own records) sets an earlier run's records aside, not appended to.
        if self._restored is None and self.starts == 1:
            self.sink.set_aside_earlier_run(env.world_size, console.line)
        # The probe times each rank alone: with plain BatchNorm, before any SyncBatchNorm (whose
        # collectives would meet the other ranks' all-gathers here, and only some ranks probe).
        self.batches = balance.resolve_batch_sizes(
            env, cfg.data, cfg.autobatch, self.module, self._probe_batch, device, dtype,
            balance.later_bytes(self.module, optimizer, cfg.optim, cfg.comm))
        model, places = self._distributed()
        self.comm = comm.attach(model, optimizer, cfg.comm, env.rank, env.world_size,
                                self._comm_saved, console.line, places, scaler)
        if places is not None:
            console.line(places.announce(cfg.comm.diloco_inner_steps, cfg.comm.diloco_wire_dtype.value))
        self.parts = StepParts(model, optimizer, scaler, dtype, device, cfg.optim.grad_clip)
        self._build_loaders()
        self.run_samples = [0] * env.world_size  # per rank, over this process's epochs
        self.run_seconds = [0.0] * env.world_size
        self._progress_since: tuple[float, int, int] | None = None  # this start's first progress record

    def _distributed(self) -> tuple[nn.Module, sites.Sites | None]:
        """The DDP model and, for hier, the sites: DDP and SyncBatchNorm over this rank's site,
        the outer all-reduce between sites (docs/sites.md); otherwise over every rank."""
        if not dist.active():
            return self.module, None
        cfg, device = self.cfg, self.device
        timeout = datetime.timedelta(seconds=cfg.dist.timeout)  # as the default group's (dist.init)
        places = sites.build(self.env, timeout) if cfg.comm.hook is CommHook.HIER else None
        group = places.group if places is not None else None
        self.module = convert_sync_bn(self.module, cfg.sync_bn, group)
        # DiLoCo replicas keep their own buffers between syncs (no broadcast per forward;
        # still one at construction, so all start equal).
        model = DistributedDataParallel(
            self.module, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.comm.bucket_cap_mb,
            forward_sync_buffers=cfg.comm.hook not in comm.DILOCO_HOOKS, process_group=group)
        return model, places

    def _build_loaders(self) -> None:
        cfg, env = self.cfg, self.env
        self.sampler = ResumableBatchSampler(len(self.data.train), self.batches.sizes, env.rank,
                                             cfg.seed)
        self.loader_seed = torch.Generator()  # keeps the global RNG untouched by DataLoader
        self.train_loader = DataLoader(IndexedDataset(self.data.train), batch_sampler=self.sampler,
                                       num_workers=cfg.data.num_workers, generator=self.loader_seed,
                                       pin_memory=self.device.type == "cuda")
        shard = Subset(self.data.test, eval_shard(len(self.data.test), env.world_size, env.rank))
        self.test_loader = DataLoader(shard, batch_size=cfg.data.eval_batch_size,
                                      num_workers=cfg.data.num_workers)

    def _probe_batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.data.train)
        x, y = default_collate([self.data.train[i % n] for i in range(size)])
        return x, y

    def _restore(self, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None) -> state.Restored | None:
        if not self.cfg.checkpoint.resume:
            return None
        saved = restore_agreed(self.ckpt, self.env.rank, self.device)
        if saved is None:
            return None
        self._comm_saved = comm.SavedComm(saved.get("comm"), saved["world_size"])
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
            totals, sync_s = self._train_epoch(epoch)
            # The sync makes the model evaluated: counted with the evaluation, not the training.
            train_s, started = time.time() - started - sync_s, time.time() - sync_s
            result = evaluate(self.module, self.test_loader, self.device, self.parts.autocast_dtype,
                              self.comm.sum_over_ranks)
            self._end_epoch(epoch, result, totals, train_s, time.time() - started, sync_s)
        final = self._result()
        self.sink.result(final)
        return final

    def _result(self) -> ResultRecord:
        rates = [n / s if s > 0 else 0.0 for n, s in zip(self.run_samples, self.run_seconds)]
        hosts = [h or "local" for h in self.batches.hosts]
        per_host: dict[str, float] = {}
        for host, rate in zip(hosts, rates):
            per_host[host] = per_host.get(host, 0.0) + rate
        return ResultRecord(
            epochs_completed=self.pos.epoch,
            metrics={"test_acc": self.pos.last_test_acc, "test_loss": self.pos.last_test_loss},
            best_test_acc=self.pos.best_acc, world_size=self.env.world_size,
            restarts=self.starts - 1, global_step=self.pos.global_step,
            batch_sizes=list(self.batches.sizes), rank_hosts=hosts,
            global_batch_size=self.batches.global_batch,
            batch_source="+".join(sorted({s.value for s in self.batches.sources})),
            rank_samples_per_s=rates, samples_per_s=per_host)

    def close(self) -> None:
        self.sink.close()

    def _announce(self) -> None:
        resolved = to_dict(self.cfg)
        self.sink.config(resolved)
        if self.cfg.log.wandb and self.env.is_main:  # after balance: the hosts of all ranks are known
            self.sink.track(wandblog.start(self.cfg, self.env, self.sink.run_dir, self.batches.hosts,
                                           self.console.line))
        self.console.line("resolved config:\n" + yaml.safe_dump(resolved, sort_keys=False).rstrip())
        b = self.batches
        self.sink.event(BalanceRecord(
            b.sizes, b.hosts, tuple(s.value for s in b.sources), b.global_batch,
            self.sampler_steps_per_epoch(),
            tuple(None if p is None else dataclasses.asdict(p) for p in b.probes),
            self.env.world_size, time.time()))
        self.console.line(f"{b.describe()}; {self.sampler_steps_per_epoch()} steps per epoch")
        r = self._restored
        if r is not None:
            self.sink.event(ResumeRecord(
                from_step=r.position.global_step, epoch=r.position.epoch,
                world_size=self.env.world_size, saved_world_size=r.saved_world_size,
                consumed_in_epoch=r.position.consumed, source_rank=r.source_rank, time=time.time()))
            self.console.line(f"resumed from step {r.position.global_step} (epoch {r.position.epoch}"
                              f" + {r.position.consumed} samples), checkpoint from rank "
                              f"{r.source_rank}, saved at world size {r.saved_world_size}; now world size "
                              f"{self.env.world_size}, lr {self.parts.optimizer.param_groups[0]['lr']:.5g}")

    def _probe_comm(self) -> None:
        steps = self.cfg.perf.comm_probe_steps
        if not dist.active() or steps <= 0:
            return
        size = min(self.batches.sizes[self.env.rank], len(self.data.train))
        with perf.kept_rng():  # augmentation draws: the training stream must not see the probe
            batch = default_collate([self.data.train[i] for i in range(size)])
        with self.comm.preserved():
            est = perf.probe_comm(self.parts, tuple(batch), steps)
        self.sink.rank_record(CommRecord(
            rank=self.env.rank, host=self.env.host, method=est.method, steps=est.steps,
            sync_s=est.sync_s, no_sync_s=est.no_sync_s, comm_s=est.comm_s,
            world_size=self.env.world_size, time=time.time()))
        self.console.line(f"comm probe: {est.comm_s * 1e3:.2f} ms/step of gradient all-reduce "
                          f"({est.sync_s * 1e3:.2f} synced vs {est.no_sync_s * 1e3:.2f} no_sync)")

    def _train_epoch(self, epoch: int) -> tuple[EpochTotals, float]:
        """The epoch's totals over all ranks, and the seconds its closing sync took."""
        self.sampler.set_epoch(epoch, self.pos.consumed)
        self.loader_seed.manual_seed(seeds.derive(self.cfg.seed, seeds.LOADER, self.env.rank, epoch,
                                                  self.pos.consumed))
        steps, n = self.sampler.steps, len(self.data.train)
        plan = self.comm.scaled(micro_steps(steps, self.env.rank, self.cfg.optim.accum_steps,
                                            self.comm.peers))
        offset = -(-self.pos.consumed // self.sampler.global_batch)
        self.console.start_epoch(epoch, len(steps), offset)
        tally = EpochTally(self.device, n, self.sampler.order[:self.pos.consumed], self.env.is_main)
        window = perf.StepWindow(self.device, self.cfg.perf.every_steps)
        cur = Cursor(self.pos.consumed, self.pos.samples_seen, self.pos.global_step)
        for i, (x, y, idx) in enumerate(self.train_loader):
            window.data_ready()
            m = plan[i]
            ls, correct = forward_backward(self.parts, x.to(self.device, non_blocking=True),
                                           y.to(self.device, non_blocking=True), m.real, m.scale,
                                           m.sync)
            tally.add(ls, correct, idx, m.real)
            cur.consumed += steps[i].real
            cur.samples_seen += steps[i].real
            cur.mine += m.real
            window.computed()
            if not m.sync:
                continue
            set_lr(self.parts.optimizer, step_lr(self.cfg.schedule, self.cfg.optim.lr,
                                                 epoch + (cur.consumed - m.window_real) / n,
                                                 epoch + cur.consumed / n, self.cfg.epochs))
            optimizer_step(self.parts)
            self.comm.stepped(cur.mine)
            cur.global_step += 1
            if window.stepped(cur.mine, m.window_real):
                self._perf_record(window, epoch, cur.global_step)
            cur.mine = 0
            if self.cfg.debug.step_sleep_seconds:
                time.sleep(self.cfg.debug.step_sleep_seconds)
            self._after_step(epoch, offset + i + 1, cur, tally, done_all=i + 1 == len(steps))
        if window.steps:
            self._perf_record(window, epoch, cur.global_step)
        # The tally's sums cross the links while the replicas become one model (its round trips
        # hidden behind the sync's crossing between sites; on flat DiLoCo-overlap they queue
        # behind the round in flight, on the same process group, which the sync waits for anyway).
        summing = tally.start()
        sync_s = self._one_model()
        totals = summing.totals()
        self.pos = self._position(cur, totals.loss_sum, totals.count, totals.correct)
        self.console.end_epoch()
        return totals, sync_s

    def _one_model(self) -> float:
        """Collective: the replicas become the one model that is evaluated and saved; returns the
        seconds it took."""
        synced = time.time()
        self.comm.consensus()
        # DDP's forward gives every rank rank 0's buffers, then each rank's batch moves its own;
        # DiLoCo replicas and hier's sites have them averaged by the sync instead.
        sites = self.comm.sites
        if self.cfg.comm.hook not in comm.DILOCO_HOOKS and (sites is None or sites.single):
            adopt_rank0_buffers(self.module)  # BatchNorm statistics: rank 0's, as the checkpoint's
        return time.time() - synced

    def _perf_record(self, window: perf.StepWindow, epoch: int, step: int) -> None:
        self.sink.rank_record(window.record(self.env.rank, self.env.host, epoch, step))

    def _position(self, cur: Cursor, loss_sum: float, count: int, correct: int) -> Position:
        return dataclasses.replace(
            self.pos, consumed=cur.consumed, samples_seen=cur.samples_seen,
            global_step=cur.global_step, epoch_loss_sum=self.pos.epoch_loss_sum + loss_sum,
            epoch_loss_count=self.pos.epoch_loss_count + count,
            epoch_correct=self.pos.epoch_correct + correct)

    def _after_step(self, epoch: int, done: int, cur: Cursor, tally: EpochTally,
                    done_all: bool) -> None:
        gs = cur.global_step
        show = done % max(self.cfg.log.print_every_steps, 1) == 0 or done_all
        self.console.step(done, float(tally.loss_sum) / max(tally.samples, 1) if show else None)
        if self.sink.progress_due():
            self.sink.progress(self._progress(epoch, done, gs, cur.samples_seen))
        if self.ckpt.due(gs) and not done_all:
            loss_sum, count, correct = tally.partial()
            self._save(is_best=False, pos=self._position(cur, loss_sum, count, correct))
            if self.cfg.debug.stop_after_step == gs:
                self._injected_stop(f"debug.stop_after_step={gs}: stopping after checkpoint")

    def _progress(self, epoch: int, done: int, step: int, samples: int) -> ProgressRecord:
        """Built only when due (every `log.progress_seconds`): a few fields more cost the loop nothing."""
        now = time.time()
        self._progress_since = self._progress_since or (now, step, samples)
        host_batches: dict[str, list[int]] = {}
        for host, size in zip(self.batches.hosts, self.batches.sizes):
            host_batches.setdefault(host or "local", []).append(size)
        return ProgressRecord(epoch, done, self.sampler_steps_per_epoch(), step, self.env.world_size, now,
                              samples, self.cfg.epochs, self.starts - 1, host_batches, self._progress_since)

    def _end_epoch(self, epoch: int, result: EvalResult, totals: EpochTotals, train_s: float,
                   eval_s: float, sync_s: float) -> None:
        pos = self.pos
        train_loss = pos.epoch_loss_sum / max(pos.epoch_loss_count, 1)
        train_acc = pos.epoch_correct / max(pos.epoch_loss_count, 1)
        is_best = result.top1 > pos.best_acc or epoch == 0
        self.pos = dataclasses.replace(
            pos, epoch=epoch + 1, consumed=0, epoch_loss_sum=0.0, epoch_loss_count=0,
            epoch_correct=0, best_acc=max(pos.best_acc, result.top1), last_test_acc=result.top1,
            last_test_loss=result.loss)
        # The epoch's record before its checkpoint: a run killed while the checkpoint is written
        # (a restart when a host comes back) resumes after this epoch, so a record written after
        # the save would be lost for good; written before, a resume that redoes the epoch writes
        # it again, and readers keep the one written last (deploy/run/report.py).
        lr = self.parts.optimizer.param_groups[0]["lr"]
        self.sink.event(EpochRecord(
            epoch + 1, train_loss, result.loss, result.top1, result.top5, lr,
            self.env.world_size, self.pos.global_step, time.time(), self.pos.samples_seen,
            train_s, eval_s, train_acc=train_acc, batch_sizes=self.batches.sizes,
            rank_samples=totals.rank_samples, rank_samples_per_s=totals.rank_samples_per_s,
            consumed_before=pos.consumed - sum(totals.rank_samples),
            coverage_min=totals.coverage_min, coverage_max=totals.coverage_max, sync_seconds=sync_s))
        self.sink.flush()
        self.sink.scalars({"train/loss": train_loss, "train/acc1": train_acc,
                           "test/loss": result.loss, "test/acc1": result.top1,
                           "test/acc5": result.top5, "lr": lr}, self.pos.global_step)
        self._log_epoch(epoch, train_loss, train_acc, result, lr, train_s, totals)
        self._save(is_best)
        if self.cfg.debug.stop_after_epoch == epoch + 1:  # the moment a kill costs the most: just saved
            self._injected_stop(f"debug.stop_after_epoch={epoch + 1}: stopping after checkpoint")
        self.sink.progress(self._progress(epoch + 1, 0, self.pos.global_step, self.pos.samples_seen), force=True)

    def _injected_stop(self, why: str) -> None:
        """A test's stop right after a checkpoint: once every host has written its copy (each writes
        after the collective part of the save), so that the first rank to raise cannot have the
        others killed mid-write."""
        dist.barrier()
        raise InjectedFailure(why)

    def _log_epoch(self, epoch: int, train_loss: float, train_acc: float, result: EvalResult,
                   lr: float, train_s: float, totals: EpochTotals) -> None:
        for r, (n, s) in enumerate(zip(totals.rank_samples, totals.rank_seconds)):
            self.run_samples[r] += n
            self.run_seconds[r] += s
        rates = ", ".join(f"{h or 'local'}/r{r} {b}x{v:.0f}/s" for r, (h, b, v) in enumerate(
            zip(self.batches.hosts, self.batches.sizes, totals.rank_samples_per_s)))
        self.console.line(f"epoch {epoch + 1}/{self.cfg.epochs} train_loss {train_loss:.4f} "
                          f"train_acc {train_acc:.4f} test_loss {result.loss:.4f} "
                          f"acc1 {result.top1:.4f} acc5 {result.top5:.4f} lr {lr:.5g} "
                          f"({train_s:.1f}s train)")
        self.console.line(f"epoch {epoch + 1} samples/s per rank (batch x rate): {rates}; "
                          f"coverage {totals.coverage_min}..{totals.coverage_max} uses per sample")

    def sampler_steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.data.train), self.batches.sizes)

    def _save(self, is_best: bool, pos: Position | None = None) -> None:
        """Collective (state gathers); one rank per checkpoint directory writes its host's copy.
        ``pos`` overrides the saved position."""
        pos = pos or self.pos
        lr = self.parts.optimizer.param_groups[0]["lr"]
        self.comm.before_save()
        comm_state = self.comm.state_dict()  # collective, like capture
        snapshot = state.capture(self.cfg, self.module, self.parts.optimizer, self.parts.scaler,
                                 pos, lr, self.env.world_size, self.ckpt.site.writer)
        if snapshot is not None:
            snapshot["comm"] = comm_state
            self.comm.same_on_every_host(snapshot, self.module)
        self.ckpt.save(snapshot, pos.global_step, is_best)  # collective: copies compared
