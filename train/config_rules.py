"""The range of every numeric config key: what torch or the trainer's code accepts, and no value
that is clearly meaningless. ``train.config`` has already made every float finite.

Contract: ``check_ranges(cfg, source)`` returns or raises ``UsageError`` with one line naming the
source, the dotted key, the allowed range and the value. One rule per key; a rule that allows 0
says what 0 means. Then the settings that cannot go together (``check_combinations``): one line
naming the source, both keys and what to do. Dataset- or model-specific limits
(``data.num_classes`` of ``shapes``, ``model.sa_points`` levels) are checked where that dataset
or model is built.
"""

from __future__ import annotations

from typing import Any

from meshrun.train.errors import UsageError
from meshrun.train.kinds import CommHook

SEED_MAX = 2**32 - 1  # numpy's RandomState takes [0, 2**32); torch 2**64 - 1, but gets seed * 100_003 + epoch
PG_TIMEOUT_MAX_S = 86_400  # as the controller's --timeout (deploy/run/flags.py): a day
BUCKET_CAP_MAX_MB = 1 << 20  # 1 TiB; DDP gives C++ int(MiB * 2**20) bytes as a 64-bit size

RANGES: tuple[tuple[str, Any, str], ...] = (
    ("seed", lambda v: 0 <= v <= SEED_MAX, f"in [0, {SEED_MAX}]"),
    ("epochs", lambda v: v >= 0, ">= 0"),
    ("model.hidden", lambda v: all(w >= 1 for w in v), "a list of widths >= 1"),
    ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model.sa_points", lambda v: all(n >= 1 for n in v), "a list of centroid counts >= 1"),
    ("model.sa_radius", lambda v: all(r > 0 for r in v), "a list of radii > 0"),
    ("model.sa_samples", lambda v: v >= 1, ">= 1"),
    ("model.width", lambda v: v >= 1, ">= 1"),
    ("data.batch_size", lambda v: v >= 1, ">= 1"),
    ("data.eval_batch_size", lambda v: v >= 1, ">= 1"),
    ("data.global_batch_size", lambda v: v >= 0, ">= 0 (0: world size x data.batch_size)"),
    ("autobatch.probe_sizes", lambda v: all(s >= 1 for s in v), "a list of sizes >= 1"),
    ("autobatch.probe_steps", lambda v: v >= 1, ">= 1"),
    ("autobatch.cpu_memory_mb", lambda v: v >= 0, ">= 0 (0: no cap)"),
    ("autobatch.cuda_memory_fraction", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("data.num_workers", lambda v: v >= 0, ">= 0"),
    ("data.test_fraction", lambda v: 0 < v < 1, "between 0 and 1"),
    ("data.split_seed", lambda v: 0 <= v <= SEED_MAX, f"in [0, {SEED_MAX}]"),
    ("data.image_size", lambda v: v >= 1, ">= 1"),
    ("data.num_classes", lambda v: v >= 2, ">= 2"),
    ("data.train_size", lambda v: v >= 1, ">= 1"),
    ("data.test_size", lambda v: v >= 1, ">= 1"),
    ("data.num_points", lambda v: v >= 1, ">= 1"),
    ("optim.lr", lambda v: v > 0, "> 0"),
    ("optim.momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optim.weight_decay", lambda v: v >= 0, ">= 0"),
    ("optim.grad_clip", lambda v: v >= 0, ">= 0 (0: no clipping)"),
    ("optim.accum_steps", lambda v: v >= 1, ">= 1"),
    ("schedule.warmup_epochs", lambda v: v >= 0, ">= 0"),
    ("schedule.step_epochs", lambda v: v >= 1, ">= 1"),
    ("schedule.gamma", lambda v: v > 0, "> 0"),
    ("schedule.min_lr", lambda v: v >= 0, ">= 0"),
    ("checkpoint.every_steps", lambda v: v >= 0, ">= 0 (0: only at epoch ends)"),
    ("checkpoint.keep_last", lambda v: v >= 1, ">= 1"),
    ("log.progress_seconds", lambda v: v >= 0, ">= 0"),
    ("perf.every_steps", lambda v: v >= 1, ">= 1"),
    ("perf.comm_probe_steps", lambda v: v >= 0, ">= 0 (0: no probe)"),
    ("dist.timeout", lambda v: 0 < v <= PG_TIMEOUT_MAX_S, f"in (0, {PG_TIMEOUT_MAX_S}] seconds"),
    ("comm.powersgd_rank", lambda v: v >= 1, ">= 1"),
    ("comm.start_iter", lambda v: v > 1, "> 1 (torch's PowerSGD needs start_powerSGD_iter > 1)"),
    ("comm.localsgd_period", lambda v: v >= 1, ">= 1"),
    ("comm.bucket_cap_mb", lambda v: 0 < v <= BUCKET_CAP_MAX_MB, f"in (0, {BUCKET_CAP_MAX_MB}] MiB"),
    ("comm.diloco_inner_steps", lambda v: v >= 1, ">= 1"),
    ("comm.diloco_outer_lr", lambda v: v > 0, "> 0"),
    ("comm.diloco_outer_momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("debug.stop_after_epoch", lambda v: v >= 0, ">= 0 (0: never)"),
    ("debug.stop_after_step", lambda v: v >= 0, ">= 0 (0: never)"),
    ("debug.step_sleep_seconds", lambda v: 0 <= v <= 60, "in [0, 60]"),
)


def check_ranges(cfg: Any, source: str) -> None:
    for key, ok, allowed in RANGES:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if not ok(value):
            raise UsageError(f"{source}: {key!r} must be {allowed}; got {value!r}")
    check_combinations(cfg, source)


def check_combinations(cfg: Any, source: str) -> None:
    """DiLoCo's inner steps communicate nothing (docs/sites.md); SyncBatchNorm would all-gather
    every BatchNorm layer's statistics over every rank at each of them, across the slow links."""
    hook = cfg.comm.hook
    if cfg.sync_bn and hook in (CommHook.DILOCO, CommHook.DILOCO_OVERLAP):
        raise UsageError(f"{source}: 'sync_bn' true and 'comm.hook' {hook.value} do not go together: "
                         f"SyncBatchNorm would communicate at every inner step; set sync_bn=false "
                         f"(the outer step averages BatchNorm statistics) or use comm.hook=hier "
                         f"(SyncBatchNorm inside each site)")
