"""Process-group lifecycle and the torchrun environment.

Contract:
- ``read_env()`` is the only place in the trainer that reads ``os.environ``. It returns a frozen
  ``DistEnv``; everything else receives that record.
- Without ``RANK`` in the environment the run is one plain process: world size 1, no process
  group, and every collective helper below degrades to a local no-op.
- A process trains on a GPU of its own or on CPU (``gpu_index``); ``dist.backend=auto`` is one
  decision for the whole job, agreed over torchrun's store before the group exists (``agree_backend``).
- On NCCL the object and bytes collectives run over a gloo group with CPU tensors (``open_object_group``).
"""

from __future__ import annotations

import datetime
import io
import os
import sys
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


def gpu_index(local_rank: int, local_world_size: int, device_count: int, share: bool = False) -> int | None:
    """The visible GPU this process trains on, or None for CPU. One GPU per process or none: NCCL
    refuses two ranks on one GPU ("Duplicate GPU detected"), so a host that starts more processes
    than it sees GPUs (the quick start's `nproc: 2` on a one-GPU laptop) trains on CPU; with `share`
    (an explicit dist.backend=gloo, which allows it) they share its GPUs round robin instead."""
    if device_count < 1 or not share and (local_world_size > device_count or local_rank >= device_count):
        return None
    return local_rank % device_count


def pick_device(env: DistEnv, backend: Backend = Backend.AUTO) -> torch.device:
    """``cuda:<local rank>`` when this host's processes each have a visible GPU (torch applies
    CUDA_VISIBLE_DEVICES), or share them on an explicit gloo; else CPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = gpu_index(env.local_rank, env.local_world_size, count, share=backend is Backend.GLOO)
    if index is None:
        if count and env.local_rank == 0:
            _warn(f"{env.local_world_size} processes on this host but {count} GPU(s) visible: training on CPU "
                  f"(one GPU per process or none; set the host's `nproc:` to {count}, or list more `gpus:`)")
        return torch.device("cpu")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _warn(text: str) -> None:
    print(f"train: warning: {text}", file=sys.stderr, flush=True)


def init(env: DistEnv, backend: Backend, timeout_s: float, device: torch.device) -> None:
    """Create the process group (torchrun's env:// rendezvous) with a deliberate timeout, so a
    vanished peer is noticed in bounded time instead of gloo's 30 minutes. ``auto`` is decided for
    the whole job (`agree_backend`), never by one rank alone; on NCCL, the object collectives get a
    gloo group of their own (`open_object_group`)."""
    if not env.launched:
        return
    if backend is Backend.NCCL and device.type != "cuda":
        raise UsageError(_nccl_without_gpu(env))
    timeout = datetime.timedelta(seconds=timeout_s)
    joined: dict[str, Any] = {}
    if backend is Backend.AUTO:
        store, backend = _agreed(env, timeout, device.type == "cuda" and torch_dist.is_nccl_available())
        joined = {"store": store, "rank": env.rank, "world_size": env.world_size}
    torch_dist.init_process_group(backend=backend.value, timeout=timeout,
                                  device_id=device if device.type == "cuda" else None, **joined)
    if backend is Backend.NCCL:
        open_object_group(timeout)


def _nccl_without_gpu(env: DistEnv) -> str:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return "dist.backend=nccl needs CUDA, but no GPU is visible; use dist.backend=gloo"
    return (f"dist.backend=nccl needs a GPU per process, and host {env.host or 'this host'} starts "
            f"{env.local_world_size} processes on {count} visible GPU(s); set its `nproc:` to at most {count} "
            "or list more `gpus:` in the inventory, or use dist.backend=gloo")


def resolve_backend(requested: Backend, gpu_ranks: int, world_size: int) -> Backend:
    """The backend the whole job uses: an explicit one as asked; ``auto`` is NCCL only when every
    rank of the job trains on a GPU of its own, else gloo (NCCL on some ranks and gloo on others
    never meet: the GPU ranks wait in NCCL's init while the others wait in gloo's until the timeout)."""
    if requested is not Backend.AUTO:
        return requested
    return Backend.NCCL if world_size > 0 and gpu_ranks == world_size else Backend.GLOO


# torchrun's store, under a prefix of meshrun's own. Each agreement (a round: one start of the job's
# workers) has keys of its own, "<n>/...", n the ranks of the rounds decided on this store before it
# (DECIDED_RANKS). A rank reads n, adds itself to the round's GPU count or no-GPU list, then counts
# itself in; the one that brings the count to the world size adds that to DECIDED_RANKS, then writes
# the decision every rank of the round waits for. A fresh store each round (meshrun's elastic runs:
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, worker rank 0 hosts a new one): n is 0 for all. A store shared
# across rounds (a non-elastic run's agent store, or a torch that shares it): rounds stay apart if every
# rank of a round reads n before its decider adds to it (true: it reads n before counting itself in) and
# no rank of the next round reads n before that add. The assumption: torchrun starts the next round's
# workers only after a rendezvous that each agent joins once its own workers have exited (a host left
# out has none that reach the store), and a decider adds before the decision that lets its round go on.
# A round that never reaches its world size (a rank died before counting itself in, or the decider
# before its add) leaves n as it was, and the next round on a shared store would count with its counts.
# Not torchrun's restart count: each agent counts its own failure restarts only, so after a failure and
# a join, ranks of one round disagreed on it and waited under different keys until the timeout. Nor a
# round from a rank's arrival number over the world size: that changes between elastic rounds.
BACKEND_PREFIX, DECIDED_RANKS, COUNTED, DECIDED = "meshrun/backend", "decided-ranks", "counted", "decided"
WITH_GPU, WITHOUT_GPU, WITHOUT_GPU_COUNT, HOST_LABEL_MAX, HOSTS_SHOWN = "gpu", "no-gpu", "no-gpu-count", 64, 8
_CODES = {Backend.GLOO: 1, Backend.NCCL: 2}  # the decision as a counter: 8 bytes to read, whoever wrote it


@dataclass(frozen=True)
class Agreement:
    backend: Backend  # the job's, as this rank uses it; round: its keys' prefix "<n>/", for `without_gpu`
    round: str


@dataclass(frozen=True)
class GpuCensus:
    with_gpu: int  # ranks of the round with a GPU of their own, and without one (each rank's word)
    without: int
    hosts: tuple[str, ...]  # of at most HOSTS_SHOWN ranks without: sorted, no repeats, each cut on read


def _label(text: str) -> str:
    return "".join(c for c in text if c.isascii() and c.isprintable())[:HOST_LABEL_MAX]


def agree_backend(store: torch_dist.Store, usable: bool, world_size: int, host: str) -> Agreement:
    """``auto`` for the whole job, over a store every rank reaches (the rounds: above). Each rank does
    a constant number of store operations, whatever the world size; a rank that never arrives fails
    the others' wait at the store's timeout, as the process group's init would."""
    here = f"{store.add(DECIDED_RANKS, 0)}/"
    if usable:
        store.add(here + WITH_GPU, 1)
    else:  # a key of its own, before this rank counts itself in, so that rank 0 finds it
        store.set(f"{here}{WITHOUT_GPU}/{store.add(here + WITHOUT_GPU_COUNT, 1)}", _label(host) or "?")
    if store.add(here + COUNTED, 1) == world_size:
        store.add(DECIDED_RANKS, world_size)  # first: the next round's keys are apart, whatever follows
        decided = resolve_backend(Backend.AUTO, store.add(here + WITH_GPU, 0), world_size)
        store.add(here + DECIDED, _CODES[decided])
    store.wait([here + DECIDED])
    # The decider is another rank: a rank without a GPU knows the answer is gloo whatever it says.
    nccl = usable and store.add(here + DECIDED, 0) == _CODES[Backend.NCCL]
    return Agreement(Backend.NCCL if nccl else Backend.GLOO, here)


def without_gpu(store: torch_dist.Store, here: str) -> GpuCensus:
    """After `agree_backend` (`here`: its round): who has a GPU. Labels are other ranks' words: at most
    HOSTS_SHOWN keys are read, each cut on read (the writer's cut is only an honest writer's). A key's
    value still arrives whole (TCPStore has no partial get): that is the bound this can give."""
    count = store.add(here + WITHOUT_GPU_COUNT, 0)
    keys = [f"{here}{WITHOUT_GPU}/{i}" for i in range(1, min(count, HOSTS_SHOWN) + 1)]
    labels = {_label(store.get(k)[:HOST_LABEL_MAX].decode("ascii", "replace")) or "?"
              for k in keys if store.check([k])}  # a count without its key: a rank's lie, not a wait
    return GpuCensus(store.add(here + WITH_GPU, 0), max(count, 0), tuple(sorted(labels)))


def gloo_warning(census: GpuCensus, world_size: int) -> str:
    """Rank 0's line on why a job with GPUs runs on gloo."""
    more = f" and {census.without - HOSTS_SHOWN} more ranks" if census.without > HOSTS_SHOWN else ""
    return (f"dist.backend=auto: gloo for the whole job, not NCCL: no GPU per process on "
            f"{', '.join(census.hosts) or '?'}{more} ({census.with_gpu} of {world_size} ranks have one and "
            "keep it); set dist.backend=gloo to silence this")


def _agreed(env: DistEnv, timeout: datetime.timedelta, usable: bool) -> tuple[torch_dist.Store, Backend]:
    """torchrun's store as ``init_process_group`` itself would open it (env://), the job's backend
    agreed on it first, and that store to hand to ``init_process_group``. Rank 0 says why a job
    with GPUs runs on gloo (a user script is not the trainer: it decides its backend itself)."""
    store, _, _ = next(torch_dist.rendezvous("env://", env.rank, env.world_size, timeout=timeout))
    store.set_timeout(timeout)
    ours = torch_dist.PrefixStore(BACKEND_PREFIX, store)
    agreed = agree_backend(ours, usable, env.world_size, env.host or f"rank {env.rank}")
    if env.is_main and agreed.backend is Backend.GLOO and (census := without_gpu(ours, agreed.round)).with_gpu:
        _warn(gloo_warning(census, env.world_size))
    return torch_dist.PrefixStore("default_pg", store), agreed.backend  # the prefix init_process_group gives its own


_object_group: torch_dist.ProcessGroup | None = None


def open_object_group(timeout: datetime.timedelta) -> None:
    """A gloo group over every rank for the object and bytes collectives below, made by every rank
    in the same order right after the NCCL group: on NCCL their buffers would be on the GPU, each
    rank receiving world size x the largest rank's bytes at every checkpoint (8 ranks of 2.8 GB
    DiLoCo state: 22 GB at once), where CPU memory holds them."""
    global _object_group
    _object_group = torch_dist.new_group(backend="gloo", timeout=timeout)


def object_channel() -> tuple[torch_dist.ProcessGroup | None, torch.device]:
    """The group and device the object collectives use: the gloo group when there is one; else the
    default group, on the current GPU when it is NCCL (a group the trainer's `init` did not make)."""
    if _object_group is not None or torch_dist.get_backend() != "nccl":
        return _object_group, torch.device("cpu")
    return None, torch.device("cuda", torch.cuda.current_device())


def shutdown() -> None:
    global _object_group
    _object_group = None
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


def _all_gather_scalar(value: float, dtype: torch.dtype, device: torch.device,
                       group: torch_dist.ProcessGroup | None = None) -> list[Any]:
    if not active():
        return [value]
    mine = torch.tensor([value], dtype=dtype, device=device)
    out = [torch.zeros_like(mine) for _ in range(torch_dist.get_world_size())]
    torch_dist.all_gather(out, mine, group=group)
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


def check_size(size: int, limit: int | None, rank: int) -> None:
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
    group, device = object_channel()
    sizes = [int(v) for v in _all_gather_scalar(buffer.getbuffer().nbytes, torch.int64, device, group)]
    for rank, size in enumerate(sizes):
        check_size(size, size_limit(buffer.getbuffer().nbytes), rank)
    mine = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    mine[:sizes[torch_dist.get_rank()]] = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(device)
    out = [torch.empty_like(mine) for _ in sizes]
    torch_dist.all_gather(out, mine, group=group)
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
    (the caller has nothing to bound it by). On `device`, or on CPU over the object group when
    there is one (NCCL: a checkpoint's bytes are no GPU memory's business)."""
    if not active():
        assert payload is not None
        return payload
    group = _object_group
    device = torch.device("cpu") if group is not None else device
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64,
                        device=device)
    torch_dist.broadcast(size, src, group=group)
    if payload is None:  # a receiver: the size is the sender's word
        check_size(int(size.item()), limit, src)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if payload is not None:
        buf.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    torch_dist.broadcast(buf, src, group=group)
    return buf.cpu().numpy().tobytes()


def barrier() -> None:
    if active():
        torch_dist.barrier()


__all__ = ["DistEnv", "read_env", "gpu_index", "pick_device", "init", "resolve_backend", "agree_backend", "Agreement",
           "GpuCensus", "without_gpu", "gloo_warning", "open_object_group", "shutdown", "all_reduce_sum", "all_reduce_sums",
           "start_sums", "rank_and_world", "all_gather_ints", "all_gather_objects", "broadcast_bytes", "barrier"]
