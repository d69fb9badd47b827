"""A restart sends the agreed checkpoint only to the ranks that lack it (train/checkpoint.restore_agreed).

Every host holds a byte-identical copy, so a rank whose copy has the lowest holder's hash reads its own;
sending it to every rank again made a 90-200 MB checkpoint outlast the 60 s group timeout on a 20 Mbit
link, and every resume failed. A rank with no copy, a damaged one or a different listed one still gets
the holder's bytes, checked against the hash the holder lists, and ends with the same state as the rest.
Real gloo ranks, forked (tests/trainer/harness.py); the bytes each rank receives are counted by wrapping
torch's broadcast and recv, whatever path carries them."""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist

from meshrun.train.checkpoint import MANIFEST, Checkpointer, checkpoint_name, read_manifest
from meshrun.train.config import CheckpointConfig
from tests.trainer.harness import fork_ranks

WORLD = 3


def _state(step: int, tag: str = "honest") -> dict[str, Any]:
    return {"format": 1, "model": {"w": torch.full((20_000,), float(step))}, "optimizer": {},
            "position": {"global_step": step, "tag": tag}, "rng": [], "world_size": WORLD}


def _relist(directory: Path, step: int, state: dict[str, Any]) -> None:
    """Rewrite a copy and list its new hash: a different copy the manifest vouches for."""
    path = directory / checkpoint_name(step)
    torch.save(state, path)
    entries = {**read_manifest(directory / MANIFEST), path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    (directory / MANIFEST).write_text("".join(f"{h}  {n}\n" for n, h in entries.items()))


def _hosts(base: Path, case: str) -> None:
    """host0..host2 hold the same steps 3 and 5 (one save, copied); then the case's change."""
    first = base / "host0"
    ckpt = Checkpointer(first, CheckpointConfig())
    for step in (3, 5):
        ckpt.save(_state(step), step, is_best=False)
    for rank in (1, 2):
        shutil.copytree(first, base / f"host{rank}")
    newest = checkpoint_name(5)
    if case == "missing":  # the lowest rank's host lost its copies: rank 1 is the holder
        shutil.rmtree(first)
    elif case == "damaged":  # rank 2's newest copy no longer matches its listing: not offered
        (base / "host2" / newest).write_bytes(b"\0" * 64)
    elif case == "different":  # rank 1 lists a different copy of step 5: the holder's is loaded
        _relist(base / "host1", 5, _state(5, "foreign"))
    elif case == "lying":  # rank 1 has no copy; rank 0 sends other bytes than it lists for step 5
        shutil.rmtree(base / "host1")


def _restore(rank: int, world: int, port: int, base: str, case: str) -> None:
    from meshrun.train import checkpoint

    signal.alarm(120)  # a mismatched send/receive would wait forever
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                  timeout=datetime.timedelta(seconds=60))
    received = [0]
    real_recv, real_broadcast = torch_dist.recv, torch_dist.broadcast

    def recv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = real_recv(tensor, *args, **kwargs)
        received[0] += tensor.numel() if tensor.dtype == torch.uint8 else 0
        return out

    def broadcast(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = real_broadcast(tensor, *args, **kwargs)
        src = args[0] if args else kwargs.get("src")
        received[0] += tensor.numel() if tensor.dtype == torch.uint8 and src != rank else 0
        return out

    torch_dist.recv, torch_dist.broadcast = recv, broadcast  # type: ignore[assignment]
    ckpt = checkpoint.Checkpointer(Path(base, f"host{rank}"), CheckpointConfig(), checkpoint.local_site(f"h{rank}"),
                                   lambda _: None)
    if case == "lying" and rank == 0:
        buf = io.BytesIO()
        torch.save(_state(5, "forged"), buf)
        honest = ckpt.read_bytes
        ckpt.read_bytes = lambda step: buf.getvalue() if step == 5 else honest(step)  # type: ignore[method-assign]
    state = checkpoint.restore_agreed(ckpt, rank, torch.device("cpu"))
    got = None if state is None else {"step": state["position"]["global_step"], "tag": state["position"]["tag"],
                                      "w": float(state["model"]["w"].sum()), "from": state["restored_from_rank"]}
    Path(base, f"rank{rank}.json").write_text(json.dumps({"received": received[0], "state": got}))
    torch_dist.destroy_process_group()


def _run(tmp_path: Path, case: str) -> tuple[list[int], list[dict[str, Any]], int]:
    _hosts(tmp_path, case)
    holder = next(tmp_path / f"host{r}" for r in range(WORLD) if (tmp_path / f"host{r}").exists())
    size = (holder / checkpoint_name(5)).stat().st_size
    fork_ranks(_restore, WORLD, str(tmp_path), case)
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return [o["received"] for o in out], [o["state"] for o in out], size


@pytest.mark.parametrize(("case", "holder", "receivers"), [
    ("same", 0, ()), ("missing", 1, (0,)), ("damaged", 0, (2,)), ("different", 0, (1,))])
def test_only_ranks_without_the_holders_copy_receive_it(tmp_path: Path, case: str, holder: int,
                                                       receivers: tuple[int, ...]) -> None:
    received, states, size = _run(tmp_path, case)
    assert received == [size if r in receivers else 0 for r in range(WORLD)]
    expected = {"step": 5, "tag": "honest", "w": 5.0 * 20_000, "from": holder}
    assert states == [expected] * WORLD  # the same state everywhere, never rank 1's foreign copy


def test_bytes_that_differ_from_the_holders_listing_are_not_loaded(tmp_path: Path) -> None:
    """Rank 0 lists the honest step 5 but sends other (loadable) bytes to rank 1, which has no copy:
    rank 1 refuses them, so no rank ends with the forged state; all fall back to step 3 together."""
    _, states, _ = _run(tmp_path, "lying")
    assert states == [{"step": 3, "tag": "honest", "w": 3.0 * 20_000, "from": 0}] * WORLD
