"""DiLoCo's arithmetic on real gloo process groups (3 ranks, uneven and varying batches): inner
steps are each rank's own, the outer step and the one-round-late overlapped update equal a
reference computed by hand in float64, and the elastic restore finishes a round exactly.

The ranks run train.comm.attach (DDP + torch's noop hook + train.diloco), train.loop's
forward_backward and optimizer_step: the trainer's own step, without its data pipeline, so every
batch and weight is known here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

from tests.trainer.harness import fork_ranks
from meshrun.train import comm
from meshrun.train.config import CommConfig, CommHook
from meshrun.train.diloco import DiLoCo, DiLoCoSettings, local_mean
from meshrun.train.loop import MicroStep, StepParts, forward_backward, optimizer_step

WORLD = 3
H = 3
STEPS = 8  # syncs after steps 3 and 6, then a flush of a 2-step partial round
LR, MU = 0.7, 0.9


def batch_size(rank: int, step: int) -> int:
    """Uneven across ranks and varying over steps, so weights are not proportional to steps."""
    return (2, 5, 3, 4, 1)[rank] + (step % 2) * (1, 0, 2, 3, 1)[rank]  # ranks 3, 4: hier's three sites


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    n = batch_size(rank, step)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def state_of(module: nn.Module) -> list[torch.Tensor]:
    """Trained parameters, then floating buffers (BatchNorm running statistics)."""
    return [t.detach().clone() for t in [*module.parameters(),
                                         *(b for b in module.buffers() if b.is_floating_point())]]


def _worker(rank: int, world: int, port: int, out: str, hook: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    module = network()
    reference = copy.deepcopy(module)  # the same steps without DDP: what "local" means
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    model = nn.parallel.DistributedDataParallel(module, forward_sync_buffers=False)
    cfg = CommConfig(hook=CommHook(hook), diloco_inner_steps=H)
    communicator = comm.attach(model, optimizer, cfg, rank, world, None, print)
    parts = StepParts(model, optimizer, None, None, torch.device("cpu"), 0.0)
    records = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        forward_backward(parts, x, y, len(y), 1.0 / len(y), True)
        optimizer_step(parts)
        F.cross_entropy(reference(x), y, reduction="mean").backward()
        ref_opt.step()
        ref_opt.zero_grad()
        before = state_of(module)
        communicator.stepped(len(y))
        records.append({"before": before, "after": state_of(module),
                        "reference": state_of(reference)})
        reference.load_state_dict(module.state_dict())  # from here on, step from where DDP is
    communicator.consensus()
    torch.save({"records": records, "flushed": state_of(module), "initial": state_of(network())},
               Path(out) / f"rank{rank}.pt")
    torch_dist.destroy_process_group()


def run_ranks(tmp_path: Path, hook: str) -> list[dict]:
    fork_ranks(_worker, WORLD, str(tmp_path), hook)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


class Outer:
    """Nesterov SGD by hand, float64: buf = mu buf + g; x -= lr (g + mu buf)."""

    def __init__(self, x: list[torch.Tensor]) -> None:
        self.x = [t.double() for t in x]
        self.buf: list[torch.Tensor] | None = None

    def step(self, g: list[torch.Tensor]) -> None:
        self.buf = g if self.buf is None else [MU * b + gi for b, gi in zip(self.buf, g)]
        self.x = [x - LR * (gi + MU * b) for x, gi, b in zip(self.x, g, self.buf)]


def round_average(ranks: list[dict], start: list[torch.Tensor], steps: range,
                  n_params: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(pseudo-gradient, buffers) of one round: sample-weighted means over ranks."""
    last = steps[-1]
    weights = [sum(batch_size(r, s) for s in steps) for r in range(WORLD)]
    ends = [[t.double() for t in ranks[r]["records"][last]["before"]] for r in range(WORLD)]
    total = sum(weights)
    g = [sum(w * (a.double() - e[i]) for w, e in zip(weights, ends)) / total
         for i, a in enumerate(start[:n_params])]
    bufs = [sum(w * e[i] for w, e in zip(weights, ends)) / total
            for i in range(n_params, len(ends[0]))]
    return g, bufs


N_PARAMS = len(list(network().parameters()))


def close(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def test_local_mean_scales_each_window_by_this_ranks_own_samples() -> None:
    plan = [MicroStep(3, 0.5, False, 8), MicroStep(2, 0.5, True, 8), MicroStep(0, 2.0, True, 1)]
    assert local_mean(plan) == [MicroStep(3, 0.2, False, 8), MicroStep(2, 0.2, True, 8),
                                MicroStep(0, 0.0, True, 1)]


@pytest.mark.slow
def test_inner_steps_are_local_and_the_outer_step_matches_the_hand_reference(tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, "diloco")
    for r in range(WORLD):  # every inner step is the rank's own plain SGD step on its own mean
        for rec in ranks[r]["records"]:
            assert close(rec["before"], rec["reference"]) <= 1e-6
    mid = [ranks[r]["records"][1]["after"] for r in range(WORLD)]
    assert close(mid[0], mid[1]) > 1e-3 and close(mid[1], mid[2]) > 1e-3  # no gradient all-reduce

    outer = Outer(ranks[0]["initial"][:N_PARAMS])
    for end, steps in ((2, range(0, 3)), (5, range(3, 6)), (None, range(6, 8))):
        start = [t.double() for t in outer.x]
        g, bufs = round_average(ranks, start, steps, N_PARAMS)
        outer.step(g)
        for r in range(WORLD):
            got = ranks[r]["records"][end]["after"] if end is not None else ranks[r]["flushed"]
            assert close(got[:N_PARAMS], outer.x) <= 1e-6, (r, end)
            assert close(got[N_PARAMS:], bufs) <= 1e-6, (r, end)


@pytest.mark.slow
def test_overlapped_update_lands_one_round_late(tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, "diloco-overlap")
    outer = Outer(ranks[0]["initial"][:N_PARAMS])
    start = [t.double() for t in outer.x]
    # Round 1 ends at step 2: nothing pending, every rank goes back to the initial parameters.
    g1, bufs1 = round_average(ranks, start, range(0, 3), N_PARAMS)
    for r in range(WORLD):
        assert close(ranks[r]["records"][2]["after"][:N_PARAMS], outer.x) <= 1e-6
    # Round 2 (from the same start) ends at step 5: round 1's average is applied.
    g2, bufs2 = round_average(ranks, start, range(3, 6), N_PARAMS)
    outer.step(g1)
    for r in range(WORLD):
        after = ranks[r]["records"][5]["after"]
        assert close(after[:N_PARAMS], outer.x) <= 1e-6 and close(after[N_PARAMS:], bufs1) <= 1e-6
    # The flush applies round 2 (pending), then the partial round 3, which started at the
    # anchor after round 1's update.
    g3, bufs3 = round_average(ranks, [t.clone() for t in outer.x], range(6, 8), N_PARAMS)
    outer.step(g2)
    outer.step(g3)
    for r in range(WORLD):
        assert close(ranks[r]["flushed"][:N_PARAMS], outer.x) <= 1e-6
        assert close(ranks[r]["flushed"][N_PARAMS:], bufs3) <= 1e-6


def test_new_world_size_completes_the_saved_round_by_hand_reference() -> None:
    """Single process, no group: the restore is local arithmetic, the same on every new rank."""
    torch.manual_seed(1)
    anchor = [torch.randn(3, 2), torch.randn(4)]
    replicas = [[a + 0.1 * torch.randn_like(a) for a in anchor] for _ in range(2)]
    momentum = [torch.randn_like(a) for a in anchor]
    settings = DiLoCoSettings(5, LR, MU, True, overlap=False)
    saver = DiLoCo(nn.ParameterList([nn.Parameter(a.clone()) for a in anchor]), settings)
    saver.outer.state = {a: {"momentum_buffer": m.clone()} for a, m in zip(saver.anchor, momentum)}
    shared = {**saver.shared_state(), "inner_step": 3}
    ranks = [{"params": p, "buffers": [], "samples": n} for p, n in zip(replicas, (96, 40))]

    module = nn.ParameterList([nn.Parameter(torch.zeros_like(a)) for a in anchor])
    DiLoCo(module, settings).restore_other_world(shared, ranks)

    g = [(96 * (a - replicas[0][i]) + 40 * (a - replicas[1][i])) / 136 for i, a in enumerate(anchor)]
    outer = Outer(anchor)
    outer.buf = [m.double() for m in momentum]
    outer.step([t.double() for t in g])
    assert close(list(module.parameters()), outer.x) <= 1e-6
