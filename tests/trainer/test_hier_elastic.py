"""``comm.hook=hier`` and DiLoCo when nodes drop out, join or resume (review hier-elastic):
the sites' process groups keep ``dist.timeout``; a resume at another world size holds one saved
replica's contribution at a time; one site is plain DDP (no outer step) whose checkpoint resumes
exactly on several sites; the config's outer optimizer settings win over the checkpoint's; a
change of hook at resume completes the saved round instead of dropping it; a checkpoint of an
outer hook written without a process group resumes under torchrun with one line.

Multi-rank tests fork gloo ranks on localhost (``tests.trainer.harness.fork_ranks``).
"""

from __future__ import annotations

import datetime
import json
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn

from meshrun.train import comm, diloco, sites
from meshrun.train.config import CommConfig, CommHook
from meshrun.train.diloco import DiLoCo, DiLoCoSettings
from meshrun.train.dist import DistEnv
from meshrun.train.loop import StepParts, forward_backward, micro_steps, optimizer_step
from meshrun.train.sampler import GlobalStep, RankBatch
from tests.trainer.harness import fork_ranks

OVERLAP = DiLoCoSettings(2, 0.7, 0.9, True, overlap=True)


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- 1. the sites' groups time out after dist.timeout -----------------------------------------

def _signal(folder: Path, name: str) -> None:
    (folder / name).write_text("done")


def _withhold(folder: Path, name: str, group: torch_dist.ProcessGroup) -> None:
    """A peer that stops answering: it joins the collective only if rank 0 is still waiting in it
    15 s later (no timeout: the run then ends, with rank 0's record saying so)."""
    for _ in range(150):
        if (folder / name).exists():
            return
        time.sleep(0.1)
    torch_dist.all_reduce(torch.ones(1), group=group)


def _outcome(group: torch_dist.ProcessGroup | None) -> str:
    try:
        torch_dist.all_reduce(torch.ones(1), group=group)
    except RuntimeError as error:  # gloo's timeout (DistBackendError is one)
        return f"error: {error}"
    return "completed"


def _timeout_worker(rank: int, world: int, port: int, out: str) -> None:
    folder = Path(out)
    # The default group keeps torch's 30 minutes: only build's own timeout can end the wait.
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    keys = ("office", "home", "office")  # office (0, 2), home (1,); representatives (0, 1)
    places = sites.build(DistEnv(launched=True, rank=rank, world_size=world, site=keys[rank]),
                         datetime.timedelta(seconds=2))
    if rank == 0:
        site = _outcome(places.group)
        _signal(folder, "site")
        cross = _outcome(places.route.cross)
        _signal(folder, "cross")
        (folder / "result.json").write_text(json.dumps({"site": site, "cross": cross}))
        _signal(folder, "end")
    else:
        group = places.group if rank == 2 else places.route.cross
        assert group is not None
        _withhold(folder, "site" if rank == 2 else "cross", group)
        while not (folder / "end").exists():  # leaving early would reset rank 0's connections
            time.sleep(0.1)


@pytest.mark.slow
def test_site_and_cross_groups_time_out_after_the_given_timeout(tmp_path: Path) -> None:
    """A peer that withholds its part of a site all-reduce, then of the representatives' one:
    rank 0 gets gloo's timeout error (torch's default for new_group is 30 minutes)."""
    fork_ranks(_timeout_worker, 3, str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    for group in ("site", "cross"):
        assert result[group].startswith("error:") and "timed out" in result[group].lower(), result


# -- 2. restore_other_world: one saved replica's contribution at a time -------------------------

def test_restore_other_world_holds_one_saved_contribution_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    module = nn.Linear(40, 30)
    shared = {"anchor": [p.detach().clone() for p in module.parameters()],
              "outer": DiLoCo(module, OVERLAP).outer.state_dict(), "inner_step": 1, "pending": None}
    saved = [{"params": [p.detach() + 0.01 * (r + 1) for p in module.parameters()], "buffers": [],
              "samples": 3 + r} for r in range(8)]
    expected = DiLoCo(nn.Linear(40, 30), OVERLAP)
    expected.load_shared(shared)
    expected._apply(torch.stack([diloco.weighted_sum(expected.anchor, r["params"], [], r["samples"])
                                 for r in saved]).sum(0))
    alive: list[weakref.ref] = []
    most = 0
    real = diloco.weighted_sum

    def counted(*args: Any) -> torch.Tensor:
        nonlocal most
        out = real(*args)
        alive.append(weakref.ref(out))
        most = max(most, sum(ref() is not None for ref in alive))
        return out

    monkeypatch.setattr(diloco, "weighted_sum", counted)
    got = DiLoCo(nn.Linear(40, 30), OVERLAP)
    got.restore_other_world(shared, saved)
    assert len(alive) == 8 and most <= 2, most  # the running total and the newest part
    assert all(gap(a, b) <= 1e-6 for a, b in zip(got.anchor, expected.anchor))


# -- 3. one site: plain DDP, no outer step ------------------------------------------------------

STEPS, H = 7, 2  # three rounds and one step of a fourth


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 3 + (rank + step) % 3  # uneven batches
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train(rank: int, world: int, places: sites.Sites | None) -> tuple[nn.Module, comm.Communicator]:
    """``STEPS`` steps of plain DDP (``places`` None) or hier over ``places`` (default outer
    settings: lr 0.7, Nesterov 0.9), then a checkpoint's ``before_save``."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    model = nn.parallel.DistributedDataParallel(module, process_group=places.group if places else None)
    cfg = CommConfig(hook=CommHook.HIER if places else CommHook.NONE, diloco_inner_steps=H)
    communicator = comm.attach(model, optimizer, cfg, rank, world, None, print, places)
    sizes = [[len(_data(r, s)[1]) for r in range(world)] for s in range(STEPS)]
    steps = [GlobalStep(tuple(RankBatch(tuple(range(n)), n) for n in s), sum(s)) for s in sizes]
    plan = communicator.scaled(micro_steps(steps, rank, 1, communicator.peers))
    parts = StepParts(model, optimizer, None, None, torch.device("cpu"), 0.0)
    for step in range(STEPS):
        x, y = _data(rank, step)
        forward_backward(parts, x, y, len(y), plan[step].scale, True)
        optimizer_step(parts)
        communicator.stepped(len(y))
    communicator.before_save()
    return module, communicator


def _single_site_worker(rank: int, world: int, port: int, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    one = sites.build(DistEnv(launched=True, rank=rank, world_size=world, site="office"))
    ddp, _ = _train(rank, world, None)
    hier, communicator = _train(rank, world, one)
    saved = comm.SavedComm(communicator.state_dict(), world)
    # The checkpoint resumed on two sites (office, home): the same world size, other sites.
    two = sites.build(DistEnv(launched=True, rank=rank, world_size=world, site=("office", "home")[rank]))
    torch.manual_seed(1)
    module = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    with torch.no_grad():  # the checkpoint's top level: the outer model (same_on_every_host)
        for p, a in zip(module.parameters(), saved.state["diloco"]["anchor"]):
            p.copy_(a)
    model = nn.parallel.DistributedDataParallel(module, process_group=two.group)
    lines: list[str] = []
    comm.attach(model, torch.optim.SGD(module.parameters(), lr=0.1), CommConfig(hook=CommHook.HIER),
                rank, world, saved, lines.append, two)
    result = {"ddp_vs_hier": gap(flat(ddp), flat(hier)), "moved": gap(flat(ddp), flat(_initial())),
              "resumed_vs_hier": gap(flat(module), flat(hier)), "describe": one.describe(),
              "sites": [len(sites.layout(one.keys)), len(sites.layout(two.keys))], "lines": lines,
              "saved_inner_step": saved.state["diloco"]["inner_step"]}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    torch_dist.destroy_process_group()


def _initial() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


@pytest.mark.slow
def test_one_site_hier_is_plain_ddp_and_resumes_exactly_on_two_sites(tmp_path: Path) -> None:
    """Both ranks in one site, default outer settings, uneven batches, a partial last round:
    hier equals plain DDP on the same data; its checkpoint (the anchor followed the model) resumes
    on two sites as that very model, the round completed from it changing nothing."""
    fork_ranks(_single_site_worker, 2, str(tmp_path))
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["moved"] > 1e-2, got  # training did move the model
        assert got["ddp_vs_hier"] <= 1e-6, got
        assert got["describe"] == "1 site: office ranks [0, 1]" and got["sites"] == [1, 2]
        assert got["saved_inner_step"] == 0, got
        assert got["resumed_vs_hier"] <= 1e-6, got
        assert any("the ranks' sites changed" in line for line in got["lines"]), got["lines"]


def test_one_site_announces_plain_ddp() -> None:
    places = sites.Sites(("office", "office"), (0, 1), None, diloco.Route())  # type: ignore[arg-type]
    assert places.single
    assert places.announce(8, "fp32") == (
        "comm: hier: 1 site: office ranks [0, 1]; plain DDP over it, no outer step (the outer model "
        "follows the model every 8 steps, for a resume on more sites)")


# -- 4. the config's outer optimizer settings win over the checkpoint's ---------------------------

def _stepped(settings: DiLoCoSettings) -> comm.Communicator:
    """A DiLoCo communicator (one process) after three inner steps of a round of 2: one round
    reduced (pending when overlapped, applied otherwise) and one step into the next."""
    torch.manual_seed(0)
    module = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    hook = CommHook.HIER if settings.overlap else CommHook.DILOCO
    communicator = comm.Communicator(hook, 1, module, diloco=DiLoCo(module, settings), optimizer=optimizer)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    for _ in range(3):
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        communicator.stepped(8)
    return communicator


def _resumed(hook: CommHook, settings: DiLoCoSettings, saved: comm.SavedComm,
             lines: list[str]) -> tuple[nn.Module, DiLoCo]:
    """A new communicator of ``hook`` restored from ``saved``, its model the checkpoint's top level."""
    module = nn.Linear(3, 2)
    with torch.no_grad():
        for p, a in zip(module.parameters(), saved.state["diloco"]["anchor"]):
            p.copy_(a)
    outer = DiLoCo(module, settings)
    communicator = comm.Communicator(hook, saved.world_size, module, diloco=outer,
                                     optimizer=torch.optim.SGD(module.parameters(), lr=0.5))
    comm._restore(communicator, 0, saved, lines.append)
    return module, outer


def test_the_configs_outer_settings_replace_the_checkpoints() -> None:
    """Saved with lr 0.7, Nesterov momentum 0.9; resumed with lr 0.2, momentum 0: the config
    holds, the stale momentum buffer is gone, an outer step is plain SGD at 0.2, and it is said."""
    saved = comm.SavedComm(_stepped(DiLoCoSettings(2, 0.7, 0.9, True, overlap=False)).state_dict(), 1)
    assert any("momentum_buffer" in s for s in saved.state["diloco"]["outer"]["state"].values())
    lines: list[str] = []
    _, outer = _resumed(CommHook.DILOCO, DiLoCoSettings(2, 0.2, 0.0, True, overlap=False), saved, lines)
    group = outer.outer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.2, 0.0, False)
    assert all("momentum_buffer" not in s for s in outer.outer.state.values())
    assert lines[-1] == ("comm: outer optimizer lr 0.7 -> 0.2, momentum 0.9 -> 0.0, nesterov True -> "
                         "False: the config's settings replace the checkpoint's")
    before = [a.clone() for a in outer.anchor]
    grads = [torch.randn_like(a) for a in outer.anchor]
    for a, g in zip(outer.anchor, grads):
        a.grad = g
    outer.outer.step()
    assert all(torch.allclose(a, b - 0.2 * g) for a, b, g in zip(outer.anchor, before, grads))


def test_unchanged_outer_settings_are_not_reported() -> None:
    saved = comm.SavedComm(_stepped(OVERLAP).state_dict(), 1)
    lines: list[str] = []
    _resumed(CommHook.HIER, OVERLAP, saved, lines)
    assert lines == ["comm: hier hook state restored from the checkpoint"]


# -- 5. a change of hook at resume completes the saved round --------------------------------------

def _saved_mid_round() -> tuple[comm.SavedComm, torch.Tensor]:
    """hier saved with a round pending and one step into the next; and the model that round
    completed gives (what a resume at another world size starts from)."""
    saved = comm.SavedComm(_stepped(OVERLAP).state_dict(), 1)
    assert saved.state["diloco"]["pending"] is not None and saved.state["diloco"]["inner_step"] == 1
    reference = DiLoCo(nn.Linear(3, 2), OVERLAP)
    reference.restore_other_world(saved.state["diloco"], saved.state["ranks"])
    return saved, torch.cat([a.reshape(-1) for a in reference.anchor])


@pytest.mark.parametrize("hook", [CommHook.DILOCO_OVERLAP, CommHook.DILOCO])
def test_another_outer_hook_completes_the_saved_round(hook: CommHook) -> None:
    saved, completed = _saved_mid_round()
    lines: list[str] = []
    settings = OVERLAP if hook is CommHook.DILOCO_OVERLAP else DiLoCoSettings(2, 0.7, 0.9, True, overlap=False)
    module, outer = _resumed(hook, settings, saved, lines)
    assert gap(flat(module), completed) <= 1e-7
    assert outer._pending is None and outer.inner_step == 0 and outer.outer.state  # momentum kept
    assert lines == [f"comm: checkpoint was saved with comm.hook=hier, now {hook.value}: {hook.value} outer "
                     "state restored; the interrupted round was completed from the 1 saved replicas and a "
                     "new round starts from the outer model"]


def _top_level(saved: comm.SavedComm) -> nn.Module:
    module = nn.Linear(3, 2)
    with torch.no_grad():
        for p, a in zip(module.parameters(), saved.state["diloco"]["anchor"]):
            p.copy_(a)
    return module


def test_a_flat_hook_gets_the_saved_round_folded_into_the_model() -> None:
    saved, completed = _saved_mid_round()
    module = _top_level(saved)
    lines: list[str] = []
    comm._restore(comm.Communicator(CommHook.FP16, 1, module), 0, saved, lines.append)
    assert gap(flat(module), completed) <= 1e-7
    assert len(lines) == 1 and "saved with comm.hook=hier" in lines[0] and "into the model" in lines[0]


@pytest.mark.parametrize("hook", [CommHook.NONE, CommHook.HIER])
def test_a_single_process_gets_the_saved_round_folded_into_the_model(hook: CommHook) -> None:
    """``comm.hook=none``, or a torchrun hier checkpoint resumed by one plain process (no group)."""
    saved, completed = _saved_mid_round()
    module = _top_level(saved)
    lines: list[str] = []
    comm.attach(module, torch.optim.SGD(module.parameters(), lr=0.5), CommConfig(hook=hook), 0, 1,
                saved, lines.append)
    assert gap(flat(module), completed) <= 1e-7
    assert lines == ["comm: checkpoint was saved with comm.hook=hier, now a single process: its interrupted "
                     "round was completed from the 1 saved replicas into the model"]


# -- 6. an outer hook's checkpoint written without a process group --------------------------------

def test_an_outer_checkpoint_without_outer_state_resumes_with_one_line() -> None:
    """Saved by ``python -m meshrun.train comm.hook=hier`` (no torchrun: no ``diloco`` entry),
    resumed under torchrun at world size 2: no KeyError; the model is the checkpoint's."""
    saved = comm.SavedComm(comm.Communicator(CommHook.HIER, 1).state_dict(), 1)
    assert "diloco" not in saved.state
    torch.manual_seed(0)
    module = nn.Linear(3, 2)
    before = flat(module)
    outer = DiLoCo(module, OVERLAP)
    communicator = comm.Communicator(CommHook.HIER, 2, module, diloco=outer,
                                     optimizer=torch.optim.SGD(module.parameters(), lr=0.5))
    lines: list[str] = []
    comm._restore(communicator, 0, saved, lines.append)
    assert lines == ["comm: checkpoint was saved with comm.hook=hier in a single process (no outer state): "
                     "the outer model starts from the checkpoint's model"]
    assert gap(flat(module), before) == 0 and outer.inner_step == 0 and outer._pending is None
