"""What keeps the ranks' replicas of the model one model beyond DDP's gradients: SyncBatchNorm,
and rank 0's buffers before an evaluation.

Contract: ``adopt_rank0_buffers`` is collective over every rank (when a process group exists)
and changes nothing but the module's buffers.
"""

from __future__ import annotations

import torch
from torch import nn

from meshrun.train import dist, state
from meshrun.train.errors import UsageError


def check_sync_bn(wanted: bool, device: torch.device) -> None:
    """Before any collective: a rank that cannot run SyncBatchNorm stops the run at once. Torch
    implements it for GPUs only."""
    if wanted and dist.active() and device.type != "cuda":
        raise UsageError("sync_bn=true needs CUDA: torch's SyncBatchNorm runs on GPUs only; "
                         "on CPU use sync_bn=false (see docs/heterogeneous.md, BatchNorm)")


def convert_sync_bn(module: nn.Module, wanted: bool,
                    group: torch.distributed.ProcessGroup | None) -> nn.Module:
    """``sync_bn: true``: BatchNorm layers become SyncBatchNorm, whose statistics are computed
    over the samples of ``group``'s ranks (None: every rank; hier: the site, so that inner steps
    cross no slow link), weighted by sample count, so uneven batches are exact. The converted
    layers hold the same Parameter and buffer objects: an optimizer made before stays valid."""
    if not wanted:
        return module
    return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group=group)


@torch.no_grad()
def adopt_rank0_buffers(module: nn.Module) -> None:
    """Collective: every rank's buffers (BatchNorm running statistics) become rank 0's, in place.
    Each rank's last forward updated them from its own batch, so without this every rank would
    evaluate a model of its own, none of them the checkpointed one (which has rank 0's buffers:
    the same broadcast, ``state._with_rank0_buffers``). Training is unchanged: DDP gives every
    rank rank 0's buffers at its next forward anyway."""
    if not dist.active():
        return
    rank0 = state._with_rank0_buffers(module)  # persistent buffers, by state_dict name
    for name, buffer in module.named_buffers():
        if name in rank0:
            buffer.copy_(rank0[name])
