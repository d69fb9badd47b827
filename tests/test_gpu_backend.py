"""Which device and backend the trainer's ranks use (train/dist.py), and where its object
collectives put their buffers.

No GPU exists on this machine. What can run here runs for real: the job-wide agreement of
``dist.backend=auto`` over a real TCPStore (one client per rank, the capability of each rank given
as an argument, because no rank here can have a GPU), ``dist.init`` under torchrun's environment in
forked gloo ranks, and the object collectives over a real gloo group. What cannot exist here is
mocked: ``torch.cuda.is_available``/``device_count``/``set_device`` are monkeypatched to describe a
one-GPU laptop, and ``torch.distributed.get_backend`` is patched to say "nccl", as the default
group of a GPU job would.
"""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as torch_dist

from meshrun.train import dist
from meshrun.train.config import Backend
from meshrun.train.errors import UsageError
from tests.trainer.harness import fork_ranks

TIMEOUT = datetime.timedelta(seconds=30)


def test_resolve_backend_is_one_answer_for_the_job() -> None:
    assert dist.resolve_backend(Backend.AUTO, 4, 4) is Backend.NCCL
    assert dist.resolve_backend(Backend.AUTO, 3, 4) is Backend.GLOO  # a GPU server and a laptop
    assert dist.resolve_backend(Backend.AUTO, 0, 4) is Backend.GLOO
    assert dist.resolve_backend(Backend.AUTO, 0, 0) is Backend.GLOO
    assert dist.resolve_backend(Backend.NCCL, 0, 4) is Backend.NCCL  # explicit: as asked
    assert dist.resolve_backend(Backend.GLOO, 4, 4) is Backend.GLOO


def test_gpu_index_is_one_gpu_per_process_or_none() -> None:
    assert [dist.gpu_index(r, 2, 1) for r in (0, 1)] == [None, None]  # quick start on a one-GPU laptop
    assert [dist.gpu_index(r, 2, 2) for r in (0, 1)] == [0, 1]
    assert [dist.gpu_index(r, 2, 4) for r in (0, 1)] == [0, 1]
    assert [dist.gpu_index(r, 8, 4) for r in range(8)] == [None] * 8  # nproc 8 on 4 GPUs
    assert dist.gpu_index(0, 1, 0) is None
    # An explicit dist.backend=gloo shares the GPUs instead (gloo allows two ranks on one GPU).
    assert [dist.gpu_index(r, 3, 2, share=True) for r in range(3)] == [0, 1, 0]
    assert dist.gpu_index(0, 2, 0, share=True) is None


def _one_gpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A machine with one visible GPU (mocked: none exists here); returns the set_device calls."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return calls


def test_two_processes_on_one_gpu_train_on_cpu(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """inventory/local.yaml's nproc: 2 on a one-GPU machine: both ranks on cuda:0 made NCCL fail
    ("Duplicate GPU detected"); each now trains on CPU, and the first says why."""
    calls = _one_gpu(monkeypatch)
    for rank in (0, 1):
        env = dist.DistEnv(launched=True, rank=rank, local_rank=rank, world_size=2, local_world_size=2)
        assert dist.pick_device(env) == torch.device("cpu")
    assert calls == []
    assert capsys.readouterr().err == (
        "train: warning: 2 processes on this host but 1 GPU(s) visible: training on CPU (one GPU per process "
        "or none; set the host's `nproc:` to 1, or list more `gpus:`)\n")
    alone = dist.DistEnv(launched=True, local_world_size=1)
    assert dist.pick_device(alone) == torch.device("cuda", 0) and calls == [0]


def test_explicit_nccl_with_more_processes_than_gpus_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _one_gpu(monkeypatch)
    env = dist.DistEnv(launched=True, rank=1, local_rank=1, world_size=2, local_world_size=2, host="laptop")
    with pytest.raises(UsageError) as err:
        dist.init(env, Backend.NCCL, 30, torch.device("cpu"))
    assert str(err.value) == ("dist.backend=nccl needs a GPU per process, and host laptop starts 2 processes on 1 "
                              "visible GPU(s); set its `nproc:` to at most 1 or list more `gpus:` in the inventory, "
                              "or use dist.backend=gloo")


def _server() -> torch_dist.TCPStore:
    return torch_dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)


def _threads(*targets: Callable[[], None]) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def _client(server: torch_dist.TCPStore, timeout: datetime.timedelta = TIMEOUT) -> torch_dist.Store:
    """A rank's view: its own client of the store, under meshrun's prefix (as `dist._agreed` opens it)."""
    return torch_dist.PrefixStore(dist.BACKEND_PREFIX, torch_dist.TCPStore("127.0.0.1", server.port, None, False,
                                                                           timeout))


def _agree(usable: list[bool], hosts: list[str], server: torch_dist.TCPStore | None = None) -> list:
    """Every rank's `agree_backend` at once, each over its own client of one real TCPStore (a fresh one,
    or `server`: a store that earlier rounds met on), and the census each then reads."""
    server = server or _server()
    results: list = [None] * len(usable)

    def rank(r: int) -> None:
        store = _client(server)
        agreed = dist.agree_backend(store, usable[r], len(usable), hosts[r])
        results[r] = (agreed, dist.without_gpu(store, agreed.round))

    _threads(*(lambda r=r: rank(r) for r in range(len(usable))))
    return results


def test_a_gpu_server_and_a_laptop_agree_on_gloo() -> None:
    """docs/heterogeneous.md's laptop next to a server: decided per rank, the server's ranks chose
    NCCL and the laptop's gloo, and both waited for the other until the timeout. Over the store,
    every rank gets gloo, and the laptop is named (a hostile name arrives printable)."""
    got = _agree([True, True, False, False], ["server", "server", "laptop", "lap\x1b[2Jtop"])
    assert got == [(dist.Agreement(Backend.GLOO, "0/"), dist.GpuCensus(2, 2, ("lap[2Jtop", "laptop")))] * 4


def test_gpus_everywhere_agree_on_nccl() -> None:
    assert _agree([True, True, True], ["a", "a", "b"]) == [(dist.Agreement(Backend.NCCL, "0/"),
                                                            dist.GpuCensus(3, 0, ()))] * 3
    assert _agree([False, False], ["a", "b"]) == [(dist.Agreement(Backend.GLOO, "0/"), dist.GpuCensus(0, 2, ("a", "b")))] * 2


def test_ranks_whose_hosts_restarted_a_different_number_of_times_agree(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An elastic run after a failure: the surviving host's agent counted one restart, the host that
    joined counts none (TORCHELASTIC_RESTART_COUNT is each agent's own). The old keys had the count
    in them: each rank waited under its own until the timeout. Two ranks through `dist._agreed`, as
    torchrun starts them (env://) on one real store (the agent's, TORCHELASTIC_USE_AGENT_STORE)."""
    server = _server()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    results: list = [None, None]

    def rank(r: int) -> None:
        env = dist.DistEnv(launched=True, rank=r, local_rank=0, world_size=2, restart_count=1 - r,
                           host=["server", "laptop"][r])
        # 30 s: under a loaded CI run a 5 s timeout let the store connect itself time out; the old keys
        # still fail it (each rank waited under its own until the timeout).
        results[r] = dist._agreed(env, datetime.timedelta(seconds=30), usable=r == 0)[1]

    _threads(lambda: rank(0), lambda: rank(1))
    assert results == [Backend.GLOO, Backend.GLOO]
    assert capsys.readouterr().err == (
        "train: warning: dist.backend=auto: gloo for the whole job, not NCCL: no GPU per process on laptop "
        "(1 of 2 ranks have one and keep it); set dist.backend=gloo to silence this\n")


def test_successive_rounds_on_one_shared_store_each_decide_their_own() -> None:
    """A store shared across rounds (a non-elastic run's agent store): world 2 with GPUs, then world 3
    with a laptop, then world 2 with GPUs again. Each round has keys of its own, named by the ranks
    decided before it; a round numbered by arrivals over its world size would put the second round's
    first rank into the first round."""
    server = _server()
    assert _agree([True, True], ["a", "b"], server) == [(dist.Agreement(Backend.NCCL, "0/"),
                                                         dist.GpuCensus(2, 0, ()))] * 2
    assert _agree([True, False, True], ["a", "laptop", "c"], server) == [(dist.Agreement(Backend.GLOO, "2/"),
                                                                          dist.GpuCensus(2, 1, ("laptop",)))] * 3
    assert _agree([True, True], ["a", "c"], server) == [(dist.Agreement(Backend.NCCL, "5/"),
                                                         dist.GpuCensus(2, 0, ()))] * 2


class _Reads:
    """A real store that records the keys rank 0 reads whole (`get`)."""

    def __init__(self, store: torch_dist.Store) -> None:
        self.store, self.got = store, list[str]()

    def get(self, key: str) -> bytes:
        self.got.append(key)
        return self.store.get(key)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def test_a_hostile_rank_cannot_make_rank_0_read_or_print_its_labels_at_length() -> None:
    """A compromised rank claims 1000 ranks without a GPU and writes 20 labels of 1 MB with a terminal
    escape (the old single `no-gpu` value was read whole and printed uncut). Rank 0 reads 8 keys and
    cuts each to 64 printable ASCII characters; the rest is a count."""
    server, census = _server(), []
    reads = _Reads(_client(server))

    def honest() -> None:
        agreed = dist.agree_backend(reads, True, 2, "server")
        census.append((agreed, dist.without_gpu(reads, agreed.round)))

    def hostile() -> None:
        store = _client(server)
        store.add(f"0/{dist.WITHOUT_GPU_COUNT}", 1000)
        for i in range(1, 21):
            store.set(f"0/{dist.WITHOUT_GPU}/{i}", b"\x1b[2J" + f"{21 - i:02d}".encode() + b"h" * (1 << 20))
        if store.add(f"0/{dist.COUNTED}", 1) == 2:  # the last to count itself in: it decides (gloo)
            store.add(f"0/{dist.DECIDED}", 1)

    _threads(honest, hostile)
    labels = tuple(f"[2J{n:02d}" + "h" * 58 for n in range(13, 21))
    assert census == [(dist.Agreement(Backend.GLOO, "0/"), dist.GpuCensus(1, 1000, labels))]
    assert reads.got == [f"0/{dist.WITHOUT_GPU}/{i}" for i in range(1, dist.HOSTS_SHOWN + 1)]
    assert dist.gloo_warning(census[0][1], 2) == (
        f"dist.backend=auto: gloo for the whole job, not NCCL: no GPU per process on {', '.join(labels)} and "
        "992 more ranks (1 of 2 ranks have one and keep it); set dist.backend=gloo to silence this")


def _auto(rank: int, world: int, port: int, base: str) -> None:
    """A rank as torchrun starts it (env://, no init_method): dist.init with backend auto."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MESHRUN_HOST="cpu-box")
    env = dist.read_env()
    device = dist.pick_device(env)
    dist.init(env, Backend.AUTO, 30, device)
    out = dist.all_gather_objects({"rank": rank, "backend": torch_dist.get_backend()})
    Path(base, f"rank{rank}").write_text(repr((device.type, out)))
    dist.shutdown()


def test_auto_agrees_then_creates_the_group_on_torchruns_store(tmp_path: Path) -> None:
    """Real gloo ranks on CPU: the agreement opens torchrun's store as init_process_group would
    (rank 0 hosts it), and the same store then carries the group's own rendezvous."""
    fork_ranks(_auto, 2, str(tmp_path))
    expected = repr(("cpu", [{"rank": 0, "backend": "gloo"}, {"rank": 1, "backend": "gloo"}]))
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == [expected, expected]


def _on_the_object_group(rank: int, world: int, port: int, base: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                  timeout=TIMEOUT)
    dist.open_object_group(TIMEOUT)  # what dist.init does after creating an NCCL group
    real_get_backend, real_gather, real_broadcast = torch_dist.get_backend, torch_dist.all_gather, torch_dist.broadcast
    seen: list[tuple[str, bool]] = []
    torch_dist.get_backend = lambda group=None: "nccl" if group is None else real_get_backend(group)

    def gather(out, tensor, group=None, **kw):  # noqa: ANN001, ANN003 - a spy with torch's signature
        seen.append((tensor.device.type, group is dist._object_group))
        return real_gather(out, tensor, group=group, **kw)

    def broadcast(tensor, src, group=None, **kw):  # noqa: ANN001, ANN003
        seen.append((tensor.device.type, group is dist._object_group))
        return real_broadcast(tensor, src, group=group, **kw)

    torch_dist.all_gather, torch_dist.broadcast = gather, broadcast
    gathered = dist.all_gather_objects({"rank": rank, "state": torch.arange(3)})
    # A caller passes its training device (cuda on NCCL); the bytes still go over CPU.
    sent = dist.broadcast_bytes(b"checkpoint" if rank == 0 else None, 0, torch.device("cuda", 0), 64)
    Path(base, "seen").write_text(repr(([g["rank"] for g in gathered], sent, seen)))
    dist.shutdown()


def test_object_collectives_on_nccl_use_cpu_tensors_on_a_gloo_group(tmp_path: Path) -> None:
    """On NCCL, all_gather_objects put world size x the largest rank's bytes on the GPU at every
    checkpoint (22 GB for 8 ranks of 2.8 GB DiLoCo state). One real gloo rank, its default group
    saying "nccl" (patched; no GPU here): the size gather, the bytes and a broadcast all go over
    the object group on CPU. The old code asked CUDA for its current device, and fails here."""
    fork_ranks(_on_the_object_group, 1, str(tmp_path))
    assert (tmp_path / "seen").read_text() == repr(([0], b"checkpoint", [("cpu", True)] * 4))
