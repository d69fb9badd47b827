"""State that must follow the model onto its GPU, and SyncBatchNorm's place in construction.

No GPU here: the ``meta`` device stands in for CUDA (any device but the CPU shows a tensor left
behind: assigning a CPU gradient to a meta tensor raises as it would on ``cuda:0``). Checkpoints
and gathered states load on the CPU (``train/safe_load.py``: ``map_location="cpu"``), so a resume
hands every restored tensor over on the CPU:
- DiLoCo-overlap and hier save the pending round's reduced buffer; restored, it must be on the
  anchor's device before the next outer step (``DiLoCo.load_shared``, ``restore_other_world``).
- PowerSGD's error feedback and P/Q memories must be on the model's device before its hook adds
  them to a bucket (``Communicator.load_rank_state``).

SyncBatchNorm (``sync_bn: true``) is built by the trainer itself on a 1-rank gloo group, with two
stand-ins for what needs CUDA: the CPU check that refuses it, and DDP's own refusal of SyncBN on
CPU modules. The ``batch_size: auto`` probe must time plain BatchNorm (SyncBN's forward in it
met the other ranks' all-gathers; on CPU it raises), and hier's SyncBN must use the site's group.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from meshrun.train import comm
from meshrun.train.config import CommConfig, CommHook, load_config
from meshrun.train.diloco import DiLoCo, DiLoCoSettings
from meshrun.train.errors import UsageError
from meshrun.train.safe_load import load_bytes
from tests.trainer.harness import fork_ranks

META = torch.device("meta")
OVERLAP = DiLoCoSettings(inner_steps=2, outer_lr=0.7, outer_momentum=0.9, nesterov=True, overlap=True)


def _as_loaded(state: dict) -> dict:
    """What a resume gets: saved with torch.save, read back by the trainer's own loader."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return load_bytes(buffer.getvalue())


def _net(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4, device=device), nn.BatchNorm1d(4, device=device),
                         nn.Linear(4, 2, device=device))


def _midround_cpu() -> tuple[nn.Module, DiLoCo]:
    """Two overlapped rounds (the first applied: the outer momentum exists; the second pending)
    and one step into the third: what an intra-epoch checkpoint of diloco-overlap/hier holds."""
    module = _net()
    diloco = DiLoCo(module, OVERLAP)
    for step in range(5):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.01 * (step + 1))
            module[1].running_mean.add_(0.1)
        diloco.stepped(4 + step)
    assert diloco.inner_step == 1 and diloco.wait() is not None and diloco.outer.state
    return module, diloco


def test_diloco_pending_round_and_outer_state_land_on_the_models_device() -> None:
    _, cpu = _midround_cpu()
    shared, mine = _as_loaded(cpu.shared_state()), _as_loaded(cpu.rank_state())
    assert shared["pending"].device.type == "cpu"
    gpu = DiLoCo(_net(META), OVERLAP)
    gpu.load_shared(shared)
    gpu.load_rank(mine)
    assert gpu.wait() is not None and gpu.wait().device == META
    momentum = [s["momentum_buffer"] for s in gpu.outer.state.values()]
    assert momentum and all(m.device == META for m in momentum)
    gpu.flush()  # the pending outer step, then the partial round's: raised on the CPU buffer
    assert (gpu.wait(), gpu.inner_step) == (None, 0)
    assert all(a.device == META for a in gpu.anchor)


def test_diloco_other_world_restore_lands_on_the_models_device() -> None:
    _, cpu = _midround_cpu()
    shared, mine = _as_loaded(cpu.shared_state()), _as_loaded(cpu.rank_state())
    gpu = DiLoCo(_net(META), OVERLAP)
    gpu.restore_other_world(shared, [mine, mine])  # two saved replicas, a new world size
    assert (gpu.wait(), gpu.inner_step) == (None, 0)
    assert all(a.device == META for a in gpu.anchor)


def test_diloco_restored_on_the_cpu_flushes_as_the_original() -> None:
    """The same arithmetic after the move (and the outer step decided on the device): a resume
    on the CPU flushes to exactly what the uninterrupted replica flushes to."""
    module, cpu = _midround_cpu()
    shared, mine = _as_loaded(cpu.shared_state()), _as_loaded(cpu.rank_state())
    again_module = copy.deepcopy(module)
    again = DiLoCo(again_module, OVERLAP)
    again.load_shared(shared)
    again.load_rank(mine)
    cpu.flush()
    again.flush()
    for a, b in zip([*module.parameters(), *module.buffers()],
                    [*again_module.parameters(), *again_module.buffers()]):
        assert torch.equal(a, b)


def _powersgd_worker(rank: int, world: int, port: int, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    module = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))
    model = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    cfg = CommConfig(hook=CommHook.POWERSGD, powersgd_rank=1, start_iter=2)
    trained = comm.attach(model, optimizer, cfg, rank, world, None, print)
    for _ in range(4):  # past start_iter: error feedback and P/Q memories exist
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    saved = _as_loaded(trained.state_dict())["ranks"][rank]
    dicts = ("error_dict", "p_memory_dict", "q_memory_dict")
    assert all(saved["powersgd"][d] for d in dicts)
    assert all(t.device.type == "cpu" for d in dicts for t in saved["powersgd"][d].values())

    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2)
    meta = nn.Sequential(nn.Linear(16, 16, device=META), nn.Linear(16, 4, device=META))
    comm.Communicator(CommHook.POWERSGD, world, meta, powersgd=state).load_rank_state(saved)
    placed = {d: sorted({str(t.device) for t in getattr(state, d).values()}) for d in dicts}
    torch.save({"placed": placed, "iter": state.iter, "group": state.process_group is None},
               Path(out) / "powersgd.pt")
    torch_dist.destroy_process_group()


def test_powersgd_state_lands_on_the_models_device(tmp_path: Path) -> None:
    fork_ranks(_powersgd_worker, 1, str(tmp_path))
    got = torch.load(tmp_path / "powersgd.pt")
    assert got == {"placed": {d: ["meta"] for d in ("error_dict", "p_memory_dict", "q_memory_dict")},
                   "iter": 4, "group": True}  # the process group the state had: None, the default


class _DDP(nn.Module):
    """Stands in for DDP, which refuses SyncBatchNorm in a CPU module; records its arguments."""

    def __init__(self, module: nn.Module, **kwargs: object) -> None:
        super().__init__()
        self.module, self.kwargs = module, kwargs


def _trainer_worker(rank: int, world: int, port: int, out: str, batch_auto: bool,
                    overrides: tuple[str, ...]) -> None:
    from meshrun.train import trainer
    from meshrun.train.dist import DistEnv
    from meshrun.train.render import make_console

    trainer.check_sync_bn = lambda wanted, device: None  # CUDA would pass it
    trainer.DistributedDataParallel = _DDP
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    cfg = load_config(Path("pointnet2_shapes.yaml"), (
        "sync_bn=true", "model.sa_points=[8,4]", "model.sa_samples=4", "model.width=4",
        "data.num_points=32", "data.train_size=16", "data.test_size=8", "log.tensorboard=false",
        "autobatch.probe_sizes=[2,4]", "autobatch.probe_steps=1", *overrides))
    env = DistEnv(launched=True, rank=rank, world_size=world, host="h1", batch_auto=batch_auto,
                  site="office")
    built = trainer.Trainer(cfg, env, Path(out) / "run", torch.device("cpu"), make_console(False, 1))
    syncbn = [m for m in built.module.modules() if isinstance(m, nn.SyncBatchNorm)]
    sites = built.comm.sites
    site_group = sites.group if sites is not None else None
    optimized = {id(p) for g in built.parts.optimizer.param_groups for p in g["params"]}
    torch.save({"syncbn": len(syncbn), "plain_bn": sum(type(m) is nn.BatchNorm1d or type(m) is nn.BatchNorm2d
                                                       for m in built.module.modules()),
                "groups_are_site": [m.process_group is site_group for m in syncbn],
                "ddp_group_is_site": built.parts.model.kwargs["process_group"] is site_group,
                "hier": sites is not None,
                "sources": [s.value for s in built.batches.sources],
                "probed": built.batches.probes[0] is not None,
                "optimizer_holds_the_model": optimized == {id(p) for p in built.module.parameters()}},
               Path(out) / "trainer.pt")
    built.close()
    torch_dist.destroy_process_group()


def _built(tmp_path: Path, batch_auto: bool, *overrides: str) -> dict:
    fork_ranks(_trainer_worker, 1, str(tmp_path), batch_auto, overrides)
    return torch.load(tmp_path / "trainer.pt")


def test_auto_batch_probe_runs_before_sync_bn(tmp_path: Path) -> None:
    """The probe times plain BatchNorm on each rank alone; SyncBN comes after, on the same
    parameters the optimizer already holds (before: SyncBN's forward ran inside the probe)."""
    got = _built(tmp_path, True)
    assert got["syncbn"] > 0 and got["plain_bn"] == 0
    assert (got["sources"], got["probed"]) == (["auto"], True)
    assert got["optimizer_holds_the_model"] and not got["hier"]
    assert all(got["groups_are_site"])  # flat: None, every rank


def test_hier_sync_bn_runs_over_the_site_group(tmp_path: Path) -> None:
    """hier: SyncBN gathers statistics inside the site, as DDP averages there; nothing per step
    crosses to the other sites (before: SyncBN over every rank)."""
    got = _built(tmp_path, False, "comm.hook=hier")
    assert got["hier"] and got["syncbn"] > 0 and got["plain_bn"] == 0
    assert all(got["groups_are_site"]) and got["ddp_group_is_site"]
    assert got["optimizer_holds_the_model"]


@pytest.mark.parametrize("hook", ["diloco", "diloco-overlap"])
def test_sync_bn_with_diloco_is_one_line_naming_both_settings(hook: str) -> None:
    with pytest.raises(UsageError) as err:
        load_config(None, ("sync_bn=true", f"comm.hook={hook}"))
    assert str(err.value).split(": ", 1)[1] == (
        f"'sync_bn' true and 'comm.hook' {hook} do not go together: SyncBatchNorm would "
        f"communicate at every inner step; set sync_bn=false (the outer step averages BatchNorm "
        f"statistics) or use comm.hook=hier (SyncBatchNorm inside each site)")
    assert load_config(None, (f"comm.hook={hook}",)).comm.hook.value == hook


@pytest.mark.parametrize("hook", ["none", "hier", "powersgd"])
def test_sync_bn_goes_with_the_other_hooks(hook: str) -> None:
    cfg = load_config(None, ("sync_bn=true", f"comm.hook={hook}"))
    assert (cfg.sync_bn, cfg.comm.hook.value) == (True, hook)
