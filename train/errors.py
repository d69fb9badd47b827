"""The trainer's domain errors.

``UsageError`` is for user mistakes (bad config, missing dataset, bad environment). It is caught
once, in ``train.__main__``, which prints its message as one line on stderr and exits with status
2. ``DeviceOutOfMemory`` is the same kind of mistake found later, by the GPU: a batch (or model)
too large for it; ``train.__main__.run`` turns torch's out-of-memory error into it, with the line
``oom_message`` builds, and exits with status 4. Programmer invariants use ``assert``; everything
else propagates with a traceback.

No torch here: ``python -m meshrun.train --check`` imports this module and must stay light.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GIB = 1024 ** 3


class UsageError(ValueError):
    """A mistake the user can fix; the message says what, where and what to do next."""


class InjectedFailure(RuntimeError):
    """Raised by the ``debug.stop_after_*`` options to simulate a crash right after a
    checkpoint; ``train.__main__`` turns it into exit status 3."""


class DeviceOutOfMemory(RuntimeError):
    """The device ran out of memory; the message is ``oom_message``'s line (exit status 4)."""


class OomPhase(str, enum.Enum):
    SETUP = "setup"  # building the trainer: model, optimizer state, checkpoint, batch-size probe
    TRAIN = "train"  # a training step, or the comm probe (which runs training batches)
    EVAL = "eval"  # train.loop.evaluate, at data.eval_batch_size


@dataclass(frozen=True)
class OomSite:
    """Where a rank ran out of device memory, and the settings that decide how much it needed."""

    rank: int
    host: str  # the inventory's name of the host ("local" outside the controller)
    device: str  # "cuda:0"
    phase: OomPhase
    batch_size: int  # this rank's training batch (TRAIN only)
    source: str  # where that size came from: train.balance.BatchSource's value (config, inventory, auto)
    accum_steps: int  # optim.accum_steps
    eval_batch_size: int  # data.eval_batch_size
    memory_fraction: float  # autobatch.cuda_memory_fraction
    memory: tuple[int, int] | None  # (in use, total) bytes of the whole device; None: unknown


def oom_message(at: OomSite) -> str:
    """One line: which rank, host and device ran out, at which setting, how full the device was,
    and the option to change."""
    kind = "CUDA" if at.device.startswith("cuda") else at.device.split(":")[0].upper()
    use = f" ({at.memory[0] / GIB:.1f} of {at.memory[1] / GIB:.1f} GiB in use)" if at.memory else ""
    what, fix = _oom_advice(at)
    return f"rank {at.rank} (host {at.host}, {at.device}): {kind} out of memory {what}{use}; {fix}"


def _oom_advice(at: OomSite) -> tuple[str, str]:
    """(where it ran out, what to do): the option that set the size that did not fit."""
    if at.phase is OomPhase.EVAL:
        return (f"in evaluation at data.eval_batch_size={at.eval_batch_size}",
                "lower data.eval_batch_size (the test metrics do not depend on it)")
    if at.phase is OomPhase.SETUP:
        return ("before training began (model, optimizer state, checkpoint)",
                "the model does not fit beside what else holds this GPU: free the GPU (nvidia-smi "
                "lists its processes) or choose a smaller model (model.*)")
    b, host = at.batch_size, at.host
    if at.source == "auto":
        return (f"at batch_size={b} (chosen by batch_size: auto)",
                f"lower autobatch.cuda_memory_fraction (now {at.memory_fraction:g}) so the probe sizes "
                f"this rank lower, or give host {host} a fixed batch_size in the inventory")
    if at.source == "inventory":
        return (f"at batch_size={b} (host {host}'s inventory)",
                f"lower batch_size for host {host} in the inventory, or set it to auto to size it "
                "to the GPU")
    if b <= 1:
        return ("at data.batch_size=1", "even one sample does not fit: choose a smaller model "
                                        "(model.*) or amp=bf16")
    return (f"at data.batch_size={b}",
            f"lower data.batch_size (halving it and doubling optim.accum_steps, now "
            f"{at.accum_steps}, keeps the samples per optimizer step), or set batch_size: auto for "
            f"host {host} in the inventory to size it to the GPU")
