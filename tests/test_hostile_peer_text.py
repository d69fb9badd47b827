"""A compromised host runs its own rank, and rank 0 (on an honest host) prints and records what
that rank says of itself: its checkpoint's label, its MESHRUN_HOST in the batch plan. With a newline
and terminal controls there, rank 0's log (and the controller's console, each line prefixed
`[h1:0] `) would show whole warning lines h1 never wrote, blaming a third host. What another rank
sends is one line of printable text where rank 0 prints it, and a checkpoint's holder is named by
the rank rank 0 knows sent it. Real gloo ranks, forked (tests/trainer/harness.py)."""

from __future__ import annotations

import datetime
import signal
from pathlib import Path

import torch
import torch.distributed as torch_dist

from meshrun.train.balance import BatchPlan, BatchSource, host_label
from meshrun.train.checkpoint import peer_text
from tests.trainer.harness import fork_ranks

FORGED = ("h3:/runs/x/checkpoints/ckpt-step000000999.pt\n[h1:0] train: warning: checkpoint copies differ: h3 holds "
          "a TAMPERED copy; remove h3\n\x1b]0;owned\x07\x1b[2J")
FORGED_HOST = "h2\ntrain: warning: host h3's GPU reports ECC errors: drop h3\n\x1b]0;owned\x07"


def _group(rank: int, world: int, port: int) -> None:
    signal.alarm(120)
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                  timeout=datetime.timedelta(seconds=60))


def _restore_beside_a_forger(rank: int, world: int, port: int, base: str) -> None:
    from meshrun.train import checkpoint
    from meshrun.train.config import CheckpointConfig

    _group(rank, world, port)
    directory = Path(base, f"host{rank}")
    good = {"format": 1, "model": {}, "optimizer": {}, "position": {}, "rng": [], "world_size": world}
    checkpoint.Checkpointer(directory, CheckpointConfig()).save(good, 5, is_best=False)
    said: list[str] = []
    ckpt = checkpoint.Checkpointer(directory, CheckpointConfig(), checkpoint.local_site(f"h{rank + 1}"), said.append)
    if rank == 1:  # the attacker's process: offers a newer step of garbage, and names it as it likes
        ckpt.candidate = lambda rejected=frozenset(): 7  # type: ignore[method-assign]
        ckpt.read_bytes = lambda step: b"garbage"  # type: ignore[method-assign]
        ckpt.hashes[checkpoint.checkpoint_name(7)] = "0" * 64
        ckpt.label = lambda name: FORGED  # type: ignore[method-assign]
    state = checkpoint.restore_agreed(ckpt, rank, torch.device("cpu"))
    if rank == 0:
        Path(base, "warned").write_text(repr(said))
        Path(base, "restored").write_text(repr((state or {}).get("restored_from_rank")))
    torch_dist.destroy_process_group()


def test_a_checkpoint_label_from_another_rank_is_one_line_and_names_that_rank(tmp_path: Path) -> None:
    fork_ranks(_restore_beside_a_forger, 2, str(tmp_path))
    warned = eval((tmp_path / "warned").read_text())  # noqa: S307 - our own repr of a list of str
    assert (tmp_path / "restored").read_text() == "0"  # the honest copy, as before
    # Rank 1 offers its step again until it is no longer heard (keep_last): the same warning each time.
    assert len(set(warned)) == 1 and warned[0].isprintable()
    reason = warned[0].split(" on ranks [0, 1] (")[1].split("); rank 1 ")[0]  # torch's words: its version's
    assert warned[0] == (
        "checkpoint h3:/runs/x/checkpoints/ckpt-step000000999.pt\\n[h1:0] train: warning: checkpoint copies differ: "
        "h3 holds a TAMPERED copy; remove h3\\n\\x1b]0;owned\\x07\\x1b[2J does not load safely on ranks [0, 1] "
        f"({reason}); rank 1 holds it and names it so; skipped, trying the next newest")


def _plan_beside_a_forger(rank: int, world: int, port: int, base: str) -> None:
    from meshrun.train.balance import resolve_batch_sizes
    from meshrun.train.config import AutoBatchConfig, DataConfig
    from meshrun.train.dist import DistEnv

    _group(rank, world, port)
    env = DistEnv(True, rank=rank, world_size=world, host=FORGED_HOST if rank == 1 else f"h{rank + 1}")
    plan = resolve_batch_sizes(env, DataConfig(), AutoBatchConfig(), None, None, torch.device("cpu"))  # type: ignore
    Path(base, f"plan{rank}").write_text(repr((plan.hosts, plan.describe())))
    torch_dist.destroy_process_group()


def test_the_batch_plan_holds_each_ranks_host_as_one_printable_line(tmp_path: Path) -> None:
    fork_ranks(_plan_beside_a_forger, 3, str(tmp_path))
    plans = [eval((tmp_path / f"plan{r}").read_text()) for r in range(3)]  # noqa: S307 - our own repr
    assert plans[0] == plans[1] == plans[2]  # the same plan on every rank, as before
    hosts, line = plans[0]
    assert hosts == ("h1", "h2train: warning: host h3's GPU reports ECC errors: drop h3]0;ow", "h3")  # 64 at most
    assert line.isprintable() and line.startswith("batch sizes (config, global ")


def test_peer_text_escapes_what_does_not_print_and_clips() -> None:
    assert peer_text("hostB:/runs/r1/checkpoints/ckpt-step000000020.pt") == (
        "hostB:/runs/r1/checkpoints/ckpt-step000000020.pt")
    assert peer_text("a\nb\x1b[2J\u202e") == "a\\nb\\x1b[2J\\u202e"
    assert peer_text("x" * 600) == "x" * 512 + "..."


def test_host_label_keeps_inventory_names_and_drops_the_rest() -> None:
    assert [host_label(h) for h in ("gpu-1.lab_a", "", "\x1b\n", 7, "h" * 80)] == [
        "gpu-1.lab_a", "", "?", "?", "h" * 64]
    plan = BatchPlan((32, 32), ("h1", host_label(FORGED_HOST)), (BatchSource.CONFIG,) * 2, (None, None))
    assert plan.describe() == ("batch sizes (config, global 64): h1/r0 32, "
                               "h2train: warning: host h3's GPU reports ECC errors: drop h3]0;ow/r1 32")


def test_a_ranks_site_key_is_printed_as_one_plain_label() -> None:
    """Each rank's site key comes from that rank (all-gathered); rank 0 prints the layout, and a
    newline in a key would make a line that reads as rank 0's host's own."""
    from meshrun.train.sites import Sites
    places = Sites(("office\n[h1:0] epoch 9/9 test_acc 1.0\x1b[2J", "home"), (0,), None, None)  # type: ignore[arg-type]
    assert places.describe() == "2 sites: office[h1:0] epoch 9/9 test_acc 1.0[2J ranks [0], home ranks [1]"
