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
