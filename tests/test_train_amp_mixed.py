"""``amp: fp16`` in a job of GPU and CPU ranks: the loss scaler is the job's, on every rank or none
(``train/amp.py``), so the replicas stay one model after each step, and every rank that ignores
``amp`` says so itself.

No GPU here. Two mocks stand in for one (the GPU rank is rank 0):
- ``trainer.amp_dtype`` answers float16 on rank 0 only, as ``amp_dtype`` answers on a CUDA rank;
  torch's CPU autocast runs float16 too, so rank 0 really computes in fp16.
- ``torch.amp.GradScaler`` builds a CPU scaler whatever device it is given: ``GradScaler("cpu")``
  does ``GradScaler("cuda")``'s arithmetic, and ``"cuda"`` here would disable itself for want of
  CUDA (a scaler that scales nothing would hide the drift).
Before the fix the GPU rank alone scaled its loss by 65536 before DDP averaged the gradients, and
the ranks' weights differed by about 1000 after one step.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from meshrun.train import amp
from meshrun.train.config import Precision, load_config
from tests.trainer.harness import fork_ranks

CPU = torch.device("cpu")


def test_a_rank_that_ignores_amp_says_so_itself() -> None:
    assert amp.cpu_note(Precision.BF16, None, False, 2, "laptop") == \
        "amp=bf16 ignored: AMP runs only on CUDA; rank 2 on laptop trains in full precision"
    assert amp.cpu_note(Precision.FP16, None, True, 1, "") == (
        "amp=fp16 ignored: AMP runs only on CUDA; rank 1 trains in full precision, its loss scaled "
        "like the fp16 GPU ranks' (GradScaler), so that every replica takes the same step")
    assert amp.cpu_note(Precision.FP16, torch.float16, True, 0, "gpu1") is None  # autocasts as asked
    assert amp.cpu_note(Precision.OFF, None, False, 0, "") is None


def test_no_fp16_rank_means_no_scaler() -> None:
    """One process, on CPU: fp16 autocasts nowhere, so nothing is scaled (and bf16 never is)."""
    assert amp.amp_dtype(Precision.FP16, CPU) is None
    assert amp.job_scaler(Precision.FP16, None, CPU) is None
    assert amp.job_scaler(Precision.BF16, None, CPU) is None
    assert amp.job_scaler(Precision.OFF, None, CPU) is None
    assert isinstance(amp.job_scaler(Precision.FP16, torch.float16, CPU), torch.amp.GradScaler)


def _rank(rank: int, world: int, port: int, out: str) -> None:
    from meshrun.train import trainer
    from meshrun.train.dist import DistEnv
    from meshrun.train.loop import forward_backward, optimizer_step
    from meshrun.train.render import make_console

    real_scaler = torch.amp.GradScaler
    torch.amp.GradScaler = lambda device="cuda", *a, **k: real_scaler("cpu", *a, **k)  # the GPU mock
    trainer.amp_dtype = lambda precision, device: torch.float16 if rank == 0 else None  # rank 0: "GPU"
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    cfg = load_config(None, ("amp=fp16", "log.tensorboard=false", "model.dropout=0"))
    env = DistEnv(launched=True, rank=rank, world_size=world, host=f"h{rank}")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        built = trainer.Trainer(cfg, env, Path(out) / f"run{rank}", CPU, make_console(False, 1))
    before = [p.detach().clone() for p in built.module.parameters()]
    x, y = built._probe_batch(16)
    mine = slice(8 * rank, 8 * rank + 8)  # each rank its own batch of 8: R = 16
    forward_backward(built.parts, x[mine], y[mine], 8, world / 16, True)
    optimizer_step(built.parts)
    flat = torch.cat([p.detach().reshape(-1) for p in built.module.parameters()])
    both = [torch.zeros_like(flat) for _ in range(world)]
    torch_dist.all_gather(both, flat)
    scaler = built.parts.scaler
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "apart": (both[0] - both[1]).abs().max().item(),
        "moved": any(not torch.equal(a, b) for a, b in zip(before, built.module.parameters())),
        "scaler": None if scaler is None else scaler.state_dict(),
        "said": [line for line in said.getvalue().splitlines() if line.startswith("amp=")]}))
    built.close()
    torch_dist.destroy_process_group()


def test_gpu_and_cpu_ranks_stay_one_model_under_fp16(tmp_path: Path) -> None:
    fork_ranks(_rank, 2, str(tmp_path))
    gpu, cpu = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert gpu["moved"] and cpu["moved"]  # a real step, not one both skipped
    assert gpu["apart"] == cpu["apart"] == 0.0  # before: ~1000
    assert gpu["scaler"] == cpu["scaler"] and gpu["scaler"]["scale"] == 65536.0  # one scaler, the job's
    assert gpu["said"] == []
    assert cpu["said"] == [amp.cpu_note(Precision.FP16, None, True, 1, "h1")]


def _built() -> tuple[nn.Module, DistributedDataParallel, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(0)
    module = nn.Linear(4, 3)
    return module, DistributedDataParallel(module), torch.optim.SGD(module.parameters(), lr=0.1), \
        torch.amp.GradScaler("cpu")


def _diloco_rank(rank: int, world: int, port: int, out: str, give_scaler: bool) -> None:
    """One DiLoCo inner step under fp16 in which rank 1 alone overflows (nothing all-reduces an
    inner step), then the trainer's save (``Trainer._save``'s calls) into a directory per rank:
    two writers, as two hosts; then a resume from this rank's own copy."""
    from meshrun.fsutil import sha256_file
    from meshrun.train import comm, state
    from meshrun.train.checkpoint import Checkpointer, open_site
    from meshrun.train.safe_load import load_file

    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    cfg = load_config(None, ("amp=fp16", "comm.hook=diloco", "comm.diloco_inner_steps=4"))
    module, model, optimizer, scaler = _built()
    communicator = comm.attach(model, optimizer, cfg.comm, rank, world, None, print, None,
                               scaler if give_scaler else None)
    loss = model(torch.ones(2, 4)).sum() * (float("inf") if rank == 1 else 1.0)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    communicator.stepped(2)
    directory = Path(out) / f"host{rank}"
    warnings: list[str] = []
    ckpt = Checkpointer(directory, cfg.checkpoint, open_site(directory, rank, f"host{rank}", CPU),
                        warnings.append)
    comm_state = communicator.state_dict()
    snapshot = state.capture(cfg, module, optimizer, scaler, state.Position(), 0.1, world, True)
    assert snapshot is not None
    snapshot["comm"] = comm_state
    communicator.same_on_every_host(snapshot, module)
    path = ckpt.save(snapshot, 1, is_best=False)
    assert path is not None
    own = scaler.state_dict()
    saved = load_file(path)
    module, model, optimizer, scaler = _built()
    state.apply(saved, module, optimizer, scaler, cfg.seed, rank, world)
    comm.attach(DistributedDataParallel(module), optimizer, cfg.comm, rank, world,
                comm.SavedComm(saved["comm"], saved["world_size"]), lambda line: None, None, scaler)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "warnings": warnings, "hash": sha256_file(path), "own": own, "top": saved["scaler"],
        "resumed": scaler.state_dict()}))
    torch_dist.destroy_process_group()


def _saved(tmp_path: Path, give_scaler: bool) -> list[dict]:
    fork_ranks(_diloco_rank, 2, str(tmp_path), give_scaler)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_diloco_scalers_apart_do_not_ship_rank0s_checkpoint(tmp_path: Path) -> None:
    """Each rank's scaler goes into the gathered per-rank state, the top level holds rank 0's: the
    two hosts' copies are byte-identical, so no save broadcasts rank 0's file (before: a warning
    naming ['scaler'] and that broadcast at every save), and a resume gives each rank its own."""
    first, second = _saved(tmp_path, give_scaler=True)
    assert first["own"]["scale"] == 65536.0 and second["own"]["scale"] == 32768.0  # apart
    assert first["warnings"] == second["warnings"] == []
    assert first["hash"] == second["hash"]
    assert first["top"] == second["top"] == first["own"]
    assert (first["resumed"], second["resumed"]) == (first["own"], second["own"])


def test_without_the_scaler_the_copies_differ_in_it(tmp_path: Path) -> None:
    """The check above is a real one: a communicator that does not hold the scaler leaves each
    writer its own, and the checkpoint layer falls back to rank 0's bytes."""
    first, _ = _saved(tmp_path, give_scaler=False)
    assert first["warnings"] == ["checkpoint copies of ranks [1] differ from rank 0's in ['scaler'] "
                                 "(state that differs per rank and is not gathered); they store "
                                 "rank 0's bytes, broadcast at every save"]
