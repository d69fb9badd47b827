"""Object collectives between ranks load nothing but plain state (issue 12's rule, for the
trainer): `train.dist.all_gather_objects` is what the trainer gathers RNG states, comm-hook state
and batch requests with. torch's own `all_gather_object` unpickles whatever another rank sends,
so a rank on a compromised host could run code in every other rank. Real gloo ranks, one of them
hostile: it speaks the same wire format (sizes, then `torch.save` bytes) but sends a pickle whose
`__reduce__` would create a file."""

from __future__ import annotations

import datetime
import io
import os
import pickle
from pathlib import Path

import torch
import torch.distributed as torch_dist

from meshrun.train import dist
from tests.trainer.harness import fork_ranks


class Planted:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # what a hostile rank would send: unpickling it runs `open(path, "w")`
        return (open, (self.path, "w"))


def _group(rank: int, world: int, port: int) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world, timeout=datetime.timedelta(seconds=60))


def _gather(rank: int, world: int, port: int, base: str) -> None:
    _group(rank, world, port)
    torch.manual_seed(rank)
    state = {"rank": rank, "rng": torch.get_rng_state(), "nested": [(1, 2.5, "x"), None],
             "sizes": torch.arange(rank + 3)}
    out = dist.all_gather_objects(state)
    assert [o["rank"] for o in out] == list(range(world))
    assert all(torch.equal(o["rng"], torch.manual_seed(r).get_state()) for r, o in enumerate(out))
    assert [o["sizes"].tolist() for o in out] == [list(range(r + 3)) for r in range(world)]  # uneven sizes
    assert out[1]["nested"] == [(1, 2.5, "x"), None]
    Path(base, f"ok{rank}").write_text("ok")
    torch_dist.destroy_process_group()


def test_plain_state_goes_round_every_rank(tmp_path: Path) -> None:
    fork_ranks(_gather, 3, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok0", "ok1", "ok2"]


def _hostile(rank: int, world: int, port: int, base: str) -> None:
    _group(rank, world, port)
    planted = os.path.join(base, "planted")
    if rank == 1:  # the hostile rank: dist's wire format, a code-running pickle inside
        buffer = io.BytesIO()
        torch.save({"value": Planted(planted)}, buffer, pickle_module=pickle)
        payload = buffer.getvalue()
        sizes = dist.all_gather_ints(len(payload), torch.device("cpu"))
        mine = torch.zeros(max(sizes), dtype=torch.uint8)
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        torch_dist.all_gather([torch.empty_like(mine) for _ in sizes], mine)
    else:
        try:
            dist.all_gather_objects({"rank": rank})
        except dist.UnsafeRankData as err:
            Path(base, f"refused{rank}").write_text(str(err))
    torch_dist.destroy_process_group()


def test_a_hostile_rank_cannot_run_code_in_the_others(tmp_path: Path) -> None:
    fork_ranks(_hostile, 3, str(tmp_path))
    assert not (tmp_path / "planted").exists()
    for rank in (0, 2):
        message = (tmp_path / f"refused{rank}").read_text()
        assert message.startswith("rank 1 sent state that does not load safely") and "compromised" in message


def _oversized(rank: int, world: int, port: int, base: str) -> None:
    _group(rank, world, port)
    if rank == 1:  # announces a terabyte: to all_gather_objects' size gather, then as a broadcast's size
        dist.all_gather_ints(1 << 40, torch.device("cpu"))
        torch_dist.broadcast(torch.tensor([1 << 40], dtype=torch.int64), 1)
    else:
        refusals = []
        for call in (lambda: dist.all_gather_objects({"rank": rank}),
                     lambda: dist.broadcast_bytes(None, 1, torch.device("cpu"), 4096)):
            try:
                call()
            except dist.UnsafeRankData as err:
                refusals.append(str(err))
        Path(base, f"refused{rank}").write_text("\n".join(refusals))
    torch_dist.destroy_process_group()


def test_a_rank_announcing_more_than_its_share_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    """A size is a rank's word: a terabyte would make every other rank allocate it (an OOM on
    another provider's host). The bound is the receiver's own share of the same state (x4 + 64 MiB),
    or the caller's limit."""
    fork_ranks(_oversized, 3, str(tmp_path))
    for rank in (0, 2):
        gathered, broadcast = (tmp_path / f"refused{rank}").read_text().split("\n")
        own = len(_saved({"value": {"rank": rank}}))
        assert gathered == (f"rank 1 announced {1 << 40} bytes where at most {4 * own + (64 << 20)} were "
                            "expected; its host may be compromised")
        assert broadcast == f"rank 1 announced {1 << 40} bytes where at most 4096 were expected; its host may be compromised"


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _restore_beside_a_liar(rank: int, world: int, port: int, base: str) -> None:
    import signal

    from meshrun.train import checkpoint
    from meshrun.train.config import CheckpointConfig

    signal.alarm(120)  # the bug this guards against is a loop whose collectives all complete
    _group(rank, world, port)
    directory = Path(base, f"host{rank}")
    good = {"format": 1, "model": {}, "optimizer": {}, "position": {}, "rng": [], "world_size": 3}
    checkpoint.Checkpointer(directory, CheckpointConfig()).save(good, 5, is_best=False)
    ckpt = checkpoint.Checkpointer(directory, CheckpointConfig(), checkpoint.local_site(f"host{rank}"), lambda _: None)
    if rank == 1:  # offers a step it does not hold, every round, and says its garbage loads
        ckpt.candidate = lambda rejected=frozenset(): 999_999_999  # type: ignore[method-assign]
        ckpt.read_bytes = lambda step: b"garbage" * 100  # type: ignore[method-assign]
        ckpt.hashes[checkpoint.checkpoint_name(999_999_999)] = "0" * 64
        honest = checkpoint._try_load
        checkpoint._try_load = lambda payload: ({"x": 1}, "") if payload.startswith(b"garbage") else honest(payload)
    state = checkpoint.restore_agreed(ckpt, rank, torch.device("cpu"))
    if rank != 1:
        Path(base, f"restored{rank}").write_text(repr((state or {}).get("restored_from_rank")))
    torch_dist.destroy_process_group()


def test_a_rank_offering_what_it_does_not_hold_cannot_hang_a_resume(tmp_path: Path) -> None:
    """Every round of the resume's agreement completes its collectives, so the process group's
    timeout never fires: a rank that offered the same unloadable step forever held the job. Its
    offers are no longer heard once they failed more often than it keeps checkpoints (keep_last),
    and the honest ranks resume from rank 0's copy."""
    fork_ranks(_restore_beside_a_liar, 3, str(tmp_path))
    assert [(tmp_path / f"restored{r}").read_text() for r in (0, 2)] == ["0", "0"]
