"""Every host holds a complete checkpoint copy (train/checkpoint.py): one writer per directory,
byte-identical copies with every rank's state, and a resume from any host's copy that continues
bit for bit. Real processes, gloo on CPU; simulated hosts are launchers on this machine (tests/trainer/forkrun.py),
each with its own run directory."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn

from meshrun.train import state
from meshrun.train.checkpoint import MANIFEST, Checkpointer, checkpoint_name, open_site, read_manifest
from meshrun.train.config import CheckpointConfig, load_config
from meshrun.train.safe_load import load_file
from meshrun.fsutil import sha256_file
from tests.test_train_checkpoint_safety import plant
from tests.trainer.harness import records, fork_ranks, train_hosts

# Ranks 0 and 2 see directory "x", rank 1 sees "y": the writers are the lowest rank of each.
DIRS = ("x", "y", "x")


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    try:
        yield
    finally:
        torch_dist.destroy_process_group()


def _elect_and_save(rank: int, world: int, port: int, base: str) -> None:
    with gloo_group(rank, world, port):
        directory = Path(base) / DIRS[rank]
        site = open_site(directory, rank, f"host{rank}", torch.device("cpu"))
        warnings: list[str] = []
        ckpt = Checkpointer(directory, CheckpointConfig(), site, warnings.append)
        # Rank 1's state differs from rank 0's, as ungathered per-rank state would.
        ckpt.save({"from": torch.tensor([rank])} if site.writer else None, 3, is_best=False)
        out = {"writer": site.writer, "writers": list(site.writers), "warnings": warnings}
        (Path(base) / f"rank{rank}.json").write_text(json.dumps(out))


def test_one_writer_per_directory_and_copies_equal_rank0s(tmp_path: Path) -> None:
    fork_ranks(_elect_and_save, 3, str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [g["writer"] for g in got] == [True, True, False]
    assert all(g["writers"] == [0, 1] for g in got)
    assert got[0]["warnings"] == ["checkpoint copies of ranks [1] differ from rank 0's in "
                                  "['from'] (state that differs per rank and is not gathered); "
                                  "they store rank 0's bytes, broadcast at every save"]
    name = checkpoint_name(3)
    assert sha256_file(tmp_path / "x" / name) == sha256_file(tmp_path / "y" / name)
    assert torch.equal(load_file(tmp_path / "y" / name)["from"], torch.tensor([0]))
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [MANIFEST, name]  # no probes


def _capture_buffers(rank: int, world: int, port: int, base: str) -> None:
    with gloo_group(rank, world, port):
        module = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
        with torch.no_grad():  # as if each rank's own batches had updated the statistics
            module[1].running_mean.fill_(rank + 1.0)
            module[1].num_batches_tracked.fill_(rank + 5)
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        snap = state.capture(load_config(None, ()), module, opt, None, state.Position(), 0.1,
                             world, writer=rank == 1)
        model = snap["model"] if snap is not None else None
        out = {"mean": None if model is None else model["1.running_mean"].tolist(),
               "count": None if model is None else int(model["1.num_batches_tracked"]),
               "live": module[1].running_mean.tolist()}
        (Path(base) / f"rank{rank}.json").write_text(json.dumps(out))


def test_saved_buffers_are_rank0s_on_every_writer(tmp_path: Path) -> None:
    fork_ranks(_capture_buffers, 2, str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got == [{"mean": None, "count": None, "live": [1.0, 1.0, 1.0]},
                   {"mean": [1.0, 1.0, 1.0], "count": 5, "live": [2.0, 2.0, 2.0]}]


# Two simulated hosts, world size 3: hostA's two ranks share one directory. digits: 1438
# samples, 3 ranks x 32 = 15 steps per epoch; step 20 is mid-epoch 2, the run ends at step 30.
HOSTS = (("hostA", 2), ("hostB", 1))
POWERSGD = ("epochs=2", "checkpoint.every_steps=5", "log.tensorboard=false", "comm.hook=powersgd",
            "comm.powersgd_rank=2", "comm.start_iter=4")
SAVED = [MANIFEST, "best.pt", checkpoint_name(10), checkpoint_name(15), checkpoint_name(20)]


def ckpts(base: Path, host: str) -> Path:
    return base / host / "run" / "checkpoints"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hosts trained with PowerSGD to step 20, then stopped (``debug.stop_after_step``)."""
    base = tmp_path_factory.mktemp("stopped")
    done = train_hosts(base, HOSTS, *POWERSGD, "debug.stop_after_step=20")
    assert all(d.returncode != 0 for d in done.values())
    assert "debug.stop_after_step=20" in done["hostA"].stderr
    return base


@pytest.mark.slow
def test_every_host_holds_the_same_complete_copy(stopped: Path) -> None:
    a, b = ckpts(stopped, "hostA"), ckpts(stopped, "hostB")
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir()) == SAVED
    assert all(sha256_file(a / n) == sha256_file(b / n) for n in SAVED)
    manifest = read_manifest(b / MANIFEST)
    assert all(sha256_file(b / n) == manifest[n] for n in SAVED[1:])
    state = load_file(b / checkpoint_name(20))
    assert (state["world_size"], state["position"]["global_step"], len(state["rng"])) == (3, 20, 3)
    ranks = [r["powersgd"] for r in state["comm"]["ranks"]]
    assert [r["iter"] for r in ranks] == [20, 20, 20]
    # hostA's ranks' error feedback is in hostB's copy, and differs per rank.
    assert not torch.equal(ranks[0]["error_dict"][0], ranks[1]["error_dict"][0])
    assert not torch.equal(ranks[1]["error_dict"][0], ranks[2]["error_dict"][0])


@pytest.mark.slow
def test_resume_from_another_hosts_copy_continues_bit_for_bit(stopped: Path,
                                                              tmp_path: Path) -> None:
    both, only_b = tmp_path / "both", tmp_path / "only_b"
    shutil.copytree(stopped, both)
    shutil.copytree(stopped, only_b)
    shutil.rmtree(ckpts(only_b, "hostA"))  # rank 0's host lost its copy
    final = checkpoint_name(30)
    for base, source in ((both, 0), (only_b, 2)):
        done = train_hosts(base, HOSTS, *POWERSGD)
        assert all(d.returncode == 0 for d in done.values()), done["hostA"].stderr[-3000:]
        assert "comm: powersgd hook state restored from the checkpoint" in done["hostA"].stdout
        resumed = records(base / "hostA" / "run", kind="resume")
        assert [(r["from_step"], r["source_rank"]) for r in resumed] == [(20, source)]
        copies = {sha256_file(ckpts(base, host) / final) for host, _ in HOSTS}
        assert len(copies) == 1
    # Model, optimizer, PowerSGD state, RNG streams and position: the same bytes.
    assert sha256_file(ckpts(both, "hostA") / final) == sha256_file(ckpts(only_b, "hostA") / final)


@pytest.mark.slow
def test_a_hostile_copy_on_one_host_is_skipped_by_all_ranks(stopped: Path,
                                                           tmp_path: Path) -> None:
    base, marker = tmp_path / "planted", tmp_path / "marker"
    shutil.copytree(stopped, base)
    planted = ckpts(base, "hostB") / checkpoint_name(25)
    plant(planted, marker, listed=True)  # hostB is the only holder of the newest step
    # hostB's step 20 is also rewritten: safe to load, but not the bytes hostA holds.
    tampered = ckpts(base, "hostB") / checkpoint_name(20)
    state = load_file(tampered)
    state["position"]["best_acc"] = 0.99
    torch.save(state, tampered)
    entries = {**read_manifest(tampered.parent / MANIFEST), tampered.name: sha256_file(tampered)}
    (tampered.parent / MANIFEST).write_text("".join(f"{h}  {n}\n" for n, h in entries.items()))

    done = train_hosts(base, HOSTS, *POWERSGD)
    assert all(d.returncode == 0 for d in done.values()), done["hostA"].stderr[-3000:]
    assert not marker.exists()
    assert (f"checkpoint hostB:{planted} does not load safely on ranks [0, 1, 2]"
            in done["hostA"].stderr)
    assert (f"copies of {checkpoint_name(20)} differ between ranks [[0, 1], [2]] (tampered or "
            "foreign); trying rank 0's") in done["hostA"].stderr
    resumed = records(base / "hostA" / "run", kind="resume")
    assert [(r["from_step"], r["source_rank"]) for r in resumed] == [(20, 0)]
    assert records(base / "hostA" / "run", kind="epoch")[-1]["global_step"] == 30
