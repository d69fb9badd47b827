"""Process-group lifecycle and the torchrun environment.

Contract:
- ``read_env()`` is the only place in the trainer that reads ``os.environ``. It returns a frozen
  ``DistEnv``; everything else receives that record.
- Without ``RANK`` in the environment the run is one plain process: world size 1, no process
  group, and every collective helper below degrades to a local no-op.
"""

from __future__ import annotations

import datetime
import io
import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as torch_dist

from meshrun.layout import ENV_BATCH_SIZE, ENV_HOST, ENV_RUN_ID, ENV_SITE
from meshrun.train.safe_load import UnsafeCheckpoint, load_bytes
from meshrun.train.config import Backend
from meshrun.train.errors import UsageError


@dataclass(frozen=True)
class DistEnv:
    """What torchrun and the meshrun controller told this process."""

    launched: bool  # True under torchrun (RANK set): a process group is created
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    group_rank: int = 0
    restart_count: int = 0  # torchrun's: failure-driven restarts of this agent only (see train/starts.py)
    rdzv_id: str = ""  # TORCHELASTIC_RUN_ID: this rendezvous (a new one per succession generation)
    master_addr: str = ""
    run_id: str = ""
    host: str = ""
    batch_size: int | None = None  # MESHRUN_BATCH_SIZE: per-process batch for this host
    batch_auto: bool = False  # MESHRUN_BATCH_SIZE=auto: size this rank by the probe
    site: str = ""  # MESHRUN_SITE: the inventory's site of this host ("": none declared)
    wandb_mode: str = ""  # WANDB_MODE, wandb's own variable ("": offline, train/wandblog.py)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Parse the torchrun/meshrun variables once; malformed values raise ``UsageError``."""
    env = os.environ if environ is None else environ
    batch = env.get(ENV_BATCH_SIZE, "")
    auto = batch == "auto"
    record = DistEnv(
        launched="RANK" in env,
        rank=_int(env, "RANK", 0),
        local_rank=_int(env, "LOCAL_RANK", 0),
        world_size=_int(env, "WORLD_SIZE", 1),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
        group_rank=_int(env, "GROUP_RANK", 0),
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
        rdzv_id=env.get("TORCHELASTIC_RUN_ID", ""),
        master_addr=env.get("MASTER_ADDR", ""),
        run_id=env.get(ENV_RUN_ID, ""),
        host=env.get(ENV_HOST, ""),
        batch_size=_int(env, ENV_BATCH_SIZE, 0) if batch and not auto else None,
        batch_auto=auto,
        site=env.get(ENV_SITE, ""),
        wandb_mode=env.get("WANDB_MODE", ""),
    )
    if record.batch_size is not None and record.batch_size < 1:
        raise UsageError(f"environment variable MESHRUN_BATCH_SIZE={batch!r} must be >= 1 "
                         "or 'auto'")
    return record


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"environment variable {name}={text!r} must be an integer") from None


def pick_device(env: DistEnv) -> torch.device:
    """``cuda:<local rank>`` when CUDA is visible (torch applies CUDA_VISIBLE_DEVICES), else CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init(env: DistEnv, backend: Backend, timeout_s: float, device: torch.device) -> None:
    """Create the process group (torchrun's env:// rendezvous) with a deliberate timeout, so a
    vanished peer is noticed in bounded time instead of gloo's 30 minutes."""
    if not env.launched:
        return
    if backend is Backend.AUTO:
        backend = Backend.NCCL if device.type == "cuda" else Backend.GLOO
    if backend is Backend.NCCL and device.type != "cuda":
        raise UsageError("dist.backend=nccl needs CUDA, but no GPU is visible; use dist.backend=gloo")
    torch_dist.init_process_group(
        backend=backend.value,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def shutdown() -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def active() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (in place, also returned); identity without a process group."""
    if active():
        torch_dist.all_reduce(values, op=torch_dist.ReduceOp.SUM)
    return values


def all_reduce_sums(*tensors: torch.Tensor) -> None:
    """Sum each tensor over ranks in place, the all-reduces started together (their round trips
    overlap) and then waited for; nothing without a process group."""
    for work in start_sums(*tensors):
        work.wait()


def start_sums(*tensors: torch.Tensor) -> tuple[torch_dist.Work, ...]:
    """Start summing each tensor over ranks in place; the caller waits for the works. None
    without a process group (the tensors are already the sums)."""
    if not active():
        return ()
    return tuple(torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM, async_op=True) for t in tensors)


def rank_and_world() -> tuple[int, int]:
    """(this rank, the world size) of the process group; (0, 1) without one."""
    return (torch_dist.get_rank(), torch_dist.get_world_size()) if active() else (0, 1)


def all_gather_ints(value: int, device: torch.device) -> list[int]:
    """Every rank's ``value``, indexed by rank."""
    return [int(v) for v in _all_gather_scalar(value, torch.int64, device)]


def _all_gather_scalar(value: float, dtype: torch.dtype, device: torch.device) -> list[Any]:
    if not active():
        return [value]
    mine = torch.tensor([value], dtype=dtype, device=device)
    out = [torch.zeros_like(mine) for _ in range(torch_dist.get_world_size())]
    torch_dist.all_gather(out, mine)
    return [t.item() for t in out]


class UnsafeRankData(RuntimeError):
    """Another rank sent bytes that do not load as plain trainer state, or more than it may."""


# Ranks gather the same kinds of state (RNG states, one model's comm state, batch requests), so
# one rank's size is a bound on another's: a rank announcing far more would make every other
# rank allocate it (and, with all_gather, send padded buffers that size to each other).
GATHER_RATIO, GATHER_SLACK_BYTES = 4, 64 << 20


def size_limit(own: int) -> int:
    """The most bytes a peer may send where this rank's own part of the same state is `own`."""
    return GATHER_RATIO * own + GATHER_SLACK_BYTES


def _check_size(size: int, limit: int | None, rank: int) -> None:
    if size < 0 or (limit is not None and size > limit):
        raise UnsafeRankData(f"rank {rank} announced {size} bytes where at most {limit} were expected; "
                             "its host may be compromised")


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank: tensors, numbers, strings, None and containers of
    them (what checkpoints hold). Not torch's ``all_gather_object``: it unpickles whatever every
    other rank sends, so one compromised host could run code in every rank of the job. Each
    rank's ``torch.save`` bytes are read back like a checkpoint (``train.safe_load``: weights-only
    and the trainer's allow-list); bytes that do not load that way raise ``UnsafeRankData``."""
    if not active():
        return [obj]
    buffer = io.BytesIO()
    torch.save({"value": obj}, buffer)
    device = (torch.device("cuda", torch.cuda.current_device()) if torch_dist.get_backend() == "nccl"
              else torch.device("cpu"))
    sizes = all_gather_ints(buffer.getbuffer().nbytes, device)
    for rank, size in enumerate(sizes):
        _check_size(size, size_limit(buffer.getbuffer().nbytes), rank)
    mine = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    mine[:sizes[torch_dist.get_rank()]] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(device)
    out = [torch.empty_like(mine) for _ in sizes]
    torch_dist.all_gather(out, mine)
    values = []
    for rank, (tensor, size) in enumerate(zip(out, sizes)):
        try:
            values.append(load_bytes(tensor[:size].cpu().numpy().tobytes())["value"])
        except (UnsafeCheckpoint, KeyError) as err:
            raise UnsafeRankData(f"rank {rank} sent state that does not load safely ({err}); "
                                 "its host may be compromised") from None
    return values


def broadcast_bytes(payload: bytes | None, src: int, device: torch.device, limit: int | None) -> bytes:
    """Send ``payload`` (only meaningful on ``src``) to every rank as a uint8 tensor. A receiver
    refuses (``UnsafeRankData``) a size above ``limit`` before allocating it; None: no bound
    (the caller has nothing to bound it by)."""
    if not active():
        assert payload is not None
        return payload
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64,
                        device=device)
    torch_dist.broadcast(size, src)
    if payload is None:  # a receiver: the size is the sender's word
        _check_size(int(size.item()), limit, src)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if payload is not None:
        buf.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    torch_dist.broadcast(buf, src)
    return buf.cpu().numpy().tobytes()


def barrier() -> None:
    if active():
        torch_dist.barrier()


__all__ = ["DistEnv", "read_env", "pick_device", "init", "shutdown", "all_reduce_sum", "all_reduce_sums", "start_sums",
           "rank_and_world",
           "all_gather_ints", "all_gather_objects", "broadcast_bytes", "barrier"]
