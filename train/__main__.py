"""``python -m meshrun.train [--config PATH] [--run-dir DIR] [--describe|--check] [key=value ...]``, alone or under torchrun.

``--describe`` prints the model's gradient shapes, the hook settings and ``sync_bn`` as one JSON
object and trains nothing (the controller uses it to size gradient communication and to leave out
the hooks the config cannot take: deploy/edges/comm.py, deploy/run/commplan.py). ``--check`` loads
the config with its overrides and exits, importing no torch: the controller runs it before any
host is contacted (deploy/edges/trainercheck.py), so a typo costs no connection.

Exit status: 0 on success; 2 for a usage error (one line on stderr, no traceback); 3 when a
``debug.stop_after_*`` option stopped the run; 4 when this rank's device ran out of memory (one
line on stderr naming the rank, host, device and the batch option to lower; no traceback; the other
ranks then time out in their next collective or are stopped by torchrun); 1 (with a traceback) for
anything else.
"""

from __future__ import annotations

import argparse
import inspect
import os
import json
import math
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from meshrun import layout
from meshrun.train.config import TrainConfig, load_config
from meshrun.train.errors import (DeviceOutOfMemory, InjectedFailure, OomPhase, OomSite, UsageError,
                                  oom_message)
from meshrun.train.render import make_console
from meshrun.train import wandblog

if TYPE_CHECKING:
    import torch

    from meshrun.train import dist
    from meshrun.train.trainer import Trainer

EXIT_USAGE = 2
EXIT_INJECTED = 3
EXIT_OOM = 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m meshrun.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config (default: the packaged train/configs/digits.yaml)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="output directory (default: runs/<MESHRUN_RUN_ID or 'local'>)")
    parser.add_argument("--describe", action="store_true",
                        help="print the model's parameter count and gradient shapes as JSON; no training")
    parser.add_argument("--check", action="store_true",
                        help="check the config and the overrides, then exit (0: valid; 2: one line on stderr)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. optim.lr=0.05 epochs=3")
    return parser.parse_args(argv)


def run(cfg: TrainConfig, env: dist.DistEnv, run_dir: Path) -> None:
    import torch

    from meshrun.train import dist
    from meshrun.train.trainer import Trainer  # heavy imports after the config is known to be valid

    device = dist.pick_device(env, cfg.dist.backend)
    trainer = None
    try:
        dist.init(env, cfg.dist.backend, cfg.dist.timeout, device)
        trainer = Trainer(cfg, env, run_dir, device, make_console(env.is_main,
                                                                  cfg.log.print_every_steps))
        trainer.fit()
    except torch.cuda.OutOfMemoryError as err:  # torch.OutOfMemoryError on newer torch: one class
        # A batch too large for the GPU is bad input, not a bug: one line, no traceback. Built here,
        # while the error's frames still hold the batch's tensors (the memory figure is the peak's).
        # Printed now, before the teardown below: after a rank's OOM its peers sit in a collective,
        # and an NCCL teardown that waited on them would hold the line back until they time out.
        line = oom_message(oom_site(cfg, env, device, trainer, err))
        print(f"train: error: {line}", file=sys.stderr, flush=True)
        raise DeviceOutOfMemory(line) from None
    finally:
        if trainer is not None:
            trainer.close()
        dist.shutdown()


def oom_site(cfg: TrainConfig, env: dist.DistEnv, device: torch.device, trainer: Trainer | None,
             err: BaseException) -> OomSite:
    """What ``oom_message`` says about ``err``: the phase (no trainer yet: setup; a frame of
    ``train.loop.evaluate``: evaluation), this rank's batch size and where it came from."""
    from meshrun.train.loop import evaluate

    if trainer is None:
        phase, size = OomPhase.SETUP, env.batch_size or cfg.data.batch_size
        source = "auto" if env.batch_auto else "inventory" if env.batch_size else "config"
    else:
        code = inspect.unwrap(evaluate).__code__  # its @torch.no_grad() wrapper is not the frame
        frames = traceback.walk_tb(err.__traceback__)
        phase = OomPhase.EVAL if any(f.f_code is code for f, _ in frames) else OomPhase.TRAIN
        size, source = trainer.batches.sizes[env.rank], trainer.batches.sources[env.rank].value
    return OomSite(env.rank, env.host or "local", str(device), phase, size, source,
                   cfg.optim.accum_steps, cfg.data.eval_batch_size,
                   cfg.autobatch.cuda_memory_fraction, device_memory(device))


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(in use, total) bytes of the whole device (every process's share), or None off CUDA or when
    CUDA cannot answer: after an out-of-memory error the context may be unusable, and a second
    error here would replace the one line with its traceback."""
    import torch

    if device.type != "cuda":
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
    except Exception:  # noqa: BLE001 - whatever it is, only the figures are lost
        return None
    return total - free, total


def describe(cfg: TrainConfig) -> dict:
    """``{"parameters", "gradient_bytes", "shapes", "sync_bn", "comm"}`` of the model ``cfg`` builds
    (fp32 grads). ``sync_bn``: the controller's `--comm` must not pick a hook that
    train/config_rules.check_combinations refuses with it, once it adds ``comm.hook=``."""
    from meshrun.train.comm import gradient_shapes
    from meshrun.train.data import build_datasets
    from meshrun.train.models import build_model

    data = build_datasets(cfg.data)
    module = build_model(cfg.model, data.num_classes, data.input_shape)
    shapes = gradient_shapes(module)
    count = sum(math.prod(s) for s in shapes)
    return {"parameters": count, "gradient_bytes": 4 * count, "shapes": shapes, "sync_bn": cfg.sync_bn,
            "comm": {"hook": cfg.comm.hook.value, "powersgd_rank": cfg.comm.powersgd_rank,
                     "localsgd_period": cfg.comm.localsgd_period,
                     "diloco_inner_steps": cfg.comm.diloco_inner_steps,
                     "diloco_wire_dtype": cfg.comm.diloco_wire_dtype.value}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, tuple(args.overrides))
        wandblog.require(cfg.log.wandb)  # every rank, and --check: a host without wandb fails here
        if args.check:
            return 0
        from meshrun.train import dist  # torch: only once the config is known to be valid

        env = dist.read_env()
        if args.describe:
            print(json.dumps(describe(cfg)), flush=True)
            return 0
        run_dir = args.run_dir or Path(layout.run_dir(env.run_id or "local"))
        run(cfg, env, run_dir)
    except UsageError as err:
        print(f"train: error: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except InjectedFailure as err:
        print(f"train: {err}", file=sys.stderr, flush=True)
        return EXIT_INJECTED
    except DeviceOutOfMemory:  # its line is printed already (run)
        return EXIT_OOM
    return 0


if __name__ == "__main__":
    code = main()  # an exception still propagates normally: a traceback and status 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization once everything is written and the process group is gone:
    # with gloo and DDP comm hooks, C++ threads torn down by static destructors at exit have
    # aborted finished runs ("terminate called without an active exception", SIGABRT), which
    # torchrun then reports as a failed rank.
    os._exit(code)
