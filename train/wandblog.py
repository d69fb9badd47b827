"""Weights & Biases beside TensorBoard (``log.wandb: true``): rank 0 logs the same epoch scalars.

Contract:
- ``require(wanted)`` runs on every rank, and for ``--check`` (no torch, no import of wandb): with
  ``log.wandb`` on, the ``wandb`` package must be importable here, else a ``UsageError`` (one line,
  exit 2, before any process group). Every host needs it: after an elastic restart rank 0 may be
  on any of them.
- ``start(...)`` runs on rank 0 only, once the hosts of the run are known; it imports wandb and
  returns a ``Tracker``, or ``None`` after one console line saying why (``wandb.init`` failing in
  online mode without network or key): rank 0 raising there would fail the whole group before
  its first step, and every restart would repeat it. Init is bounded by half the collective
  timeout, so the other ranks, waiting in their next collective, do not time out meanwhile.
- ``Tracker.log`` gets exactly what TensorBoard gets (``MetricsSink.scalars``: the epoch scalars,
  same keys, at the global step) and never raises: its first failure is one line and ends it.
- ``Tracker.close`` finishes the run and shuts wandb's service process down (``__main__`` leaves
  with ``os._exit``, which skips wandb's exit hooks), so nothing of wandb outlives the trainer,
  then removes the links wandb-core leaves in the run: ``fab fetch-checkpoints`` brings regular
  files only and would name each link as skipped.

Mode: ``offline`` unless the environment sets ``WANDB_MODE`` (e.g. the inventory's ``env:``). The
run is written under ``<run dir>/wandb/``, so it comes home with the run dir; ``wandb sync``
uploads it. Its config is the trainer config as run plus ``meshrun`` (run id, host of each
rank); its tags are the run's host names, in rank order.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from meshrun.train.errors import UsageError

if TYPE_CHECKING:
    from meshrun.train.config import TrainConfig
    from meshrun.train.dist import DistEnv

DEFAULT_MODE = "offline"  # no network unless the user asks for it with WANDB_MODE
INIT_TIMEOUT_S = 30.0  # wandb.init, its service's start included; and at most half of dist.timeout
FINISH_TIMEOUT_S = 60.0  # online: uploading what is left may not hold the run's end for longer
TAG_MAX = 64  # wandb refuses longer tags (inventory host names are at most 64 characters)
MESSAGE_MAX = 300


def require(wanted: bool) -> None:
    if wanted and not _installed():
        raise UsageError("log.wandb=true needs the wandb package, which this python cannot import: "
                         "pip install wandb (on every host: add it to the project's requirements "
                         "for fab setup), or set log.wandb=false")


def _installed() -> bool:
    try:
        return importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        return False


class Tracker:
    """One wandb run of this trainer process (rank 0)."""

    def __init__(self, wandb: Any, run: Any, home: Path, say: Callable[[str], None]) -> None:
        self._wandb, self._run, self._home, self._say = wandb, run, home, say
        self._logging = True

    def log(self, values: dict[str, float], step: int) -> None:
        if not self._logging:
            return
        try:
            self._run.log(dict(values), step=step)
        except Exception as err:  # noqa: BLE001 - a tracker never stops training
            self._logging = False
            self._say(f"wandb: logging stopped at step {step}: {_one_line(err)}; "
                      "metrics.jsonl and tensorboard/ still have every epoch")

    def close(self, exit_code: int) -> None:
        try:
            self._run.finish(exit_code=exit_code)
        except Exception as err:  # noqa: BLE001
            self._say(f"wandb: finishing the run failed: {_one_line(err)}")
        finally:
            _teardown(self._wandb, self._say)
            _drop_links(self._home)


def start(cfg: TrainConfig, env: DistEnv, run_dir: Path, rank_hosts: tuple[str, ...],
          say: Callable[[str], None]) -> Tracker | None:
    """Rank 0: a wandb run in ``run_dir/wandb``; ``None`` (after one line) when wandb will not start."""
    from meshrun.train.config import to_dict

    hosts = [h or "local" for h in rank_hosts]
    config = {**to_dict(cfg), "meshrun": {"run_id": env.run_id, "rank_hosts": hosts}}
    bound = min(INIT_TIMEOUT_S, cfg.dist.timeout / 2) / 2  # starting wandb-core, then init
    wandb = None
    try:
        import wandb

        settings = wandb.Settings(
            mode=env.wandb_mode or DEFAULT_MODE, console="off", silent=True, symlink=False,
            init_timeout=bound, x_service_wait=bound, finish_timeout=FINISH_TIMEOUT_S)
        run_dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(dir=str(run_dir), project=cfg.log.wandb_project or None,
                         name=env.run_id or None, group=env.run_id or None, config=config,
                         tags=[h[:TAG_MAX] for h in dict.fromkeys(hosts)], settings=settings)
    except Exception as err:  # noqa: BLE001 - asked for, not given: say so, train on
        say(f"wandb: not logging this run: {_one_line(err)}; metrics.jsonl and tensorboard/ "
            "still have every epoch")
        if wandb is not None:
            _teardown(wandb, say)  # a failed init can leave wandb-core running
        return None
    if run.settings.mode == "offline":
        where = Path(run.dir).parent
        say(f"wandb: offline run in {where}; upload it with: wandb sync {where}")
    else:
        say(f"wandb: logging to {run.url or run.settings.mode}")
    return Tracker(wandb, run, run_dir / "wandb", say)


def _teardown(wandb: Any, say: Callable[[str], None]) -> None:
    try:
        wandb.teardown()  # stops wandb-core and waits for it
    except Exception as err:  # noqa: BLE001
        say(f"wandb: shutting down its service failed: {_one_line(err)}")


def _drop_links(where: Path) -> None:
    for top, dirs, files in os.walk(where):  # does not descend into linked directories
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                os.unlink(path)


def _one_line(err: BaseException) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."
