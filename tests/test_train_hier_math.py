"""comm.hook=hier on real gloo process groups (3 ranks, sites 2 + 1; and 5 ranks in three places,
2 + 1 + 2; uneven and varying batches):
inside a site DDP's step is exactly the step on the site's joined batch, and every H steps the
outer Nesterov step uses the sample-weighted mean of the sites' pseudo-gradients: equal, to 1e-6,
to one process computing it all in float64 from the same data, synchronous and overlapped (one
round late) alike. With ``comm.diloco_wire_dtype=bf16`` the sites' sums cross as bfloat16: the
route's result is bit for bit the bfloat16 sum of the fp32 site sums (the weights exact), and
training stays within bfloat16's rounding of the fp32 run.

The ranks run the trainer's own pieces: train.sites.build (torch new_group per site and for the
representatives), DDP over the site group, train.comm.attach, train.loop's micro_steps (site
scaling), forward_backward and optimizer_step.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

from meshrun.train import comm, sites
from meshrun.train.config import CommConfig, CommHook, WireDtype
from meshrun.train.diloco import Route
from meshrun.train.dist import DistEnv
from meshrun.train.loop import MicroStep, StepParts, forward_backward, micro_steps, optimizer_step
from meshrun.train.sampler import GlobalStep, RankBatch
from tests.test_train_diloco_math import LR, MU, Outer, batch, batch_size, close  # uneven, varying
from tests.trainer.harness import fork_ranks

KEYS = ("office", "home", "office")  # sites 2 + 1; the office's ranks are not adjacent
SITES = ((0, 2), (1,))
# Three places (a researcher's office, home and rented pair): three representatives in the ring.
KEYS3 = ("office", "home", "dc", "office", "dc")
SITES3 = ((0, 3), (1,), (2, 4))
WORLD, H, STEPS = 3, 3, 8  # rounds end after steps 3 and 6, then a flush of a 2-step round
INNER_LR, INNER_MU = 0.1, 0.9


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def global_steps(world: int = WORLD) -> list[GlobalStep]:
    out = []
    for step in range(STEPS):
        sizes = [batch_size(r, step) for r in range(world)]
        out.append(GlobalStep(tuple(RankBatch(tuple(range(n)), n) for n in sizes), sum(sizes)))
    return out


def _run(rank: int, places: sites.Sites, overlap: bool, wire: WireDtype = WireDtype.FP32,
         world: int = WORLD) -> dict:
    module = network()
    optimizer = torch.optim.SGD(module.parameters(), lr=INNER_LR, momentum=INNER_MU)
    model = nn.parallel.DistributedDataParallel(module, process_group=places.group)
    cfg = CommConfig(hook=CommHook.HIER, diloco_inner_steps=H, diloco_outer_lr=LR, diloco_outer_momentum=MU,
                     diloco_wire_dtype=wire)
    communicator = comm.attach(model, optimizer, cfg, rank, world, None, print, places)
    if not overlap:
        communicator.diloco.settings = type(communicator.diloco.settings)(H, LR, MU, True, overlap=False,
                                                                          wire=communicator.diloco.settings.wire)
    plan = communicator.scaled(micro_steps(global_steps(world), rank, 1, communicator.peers))
    parts = StepParts(model, optimizer, None, None, torch.device("cpu"), 0.0)
    records = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        forward_backward(parts, x, y, plan[step].real, plan[step].scale, plan[step].sync)
        optimizer_step(parts)
        before = params(module)
        communicator.stepped(len(y))
        records.append({"before": before, "after": params(module)})
    communicator.consensus()
    return {"records": records, "flushed": params(module), "peers": list(communicator.peers)}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    places = sites.build(DistEnv(launched=True, rank=rank, world_size=world, site=KEYS[rank]))
    result = {"sync": _run(rank, places, False), "overlap": _run(rank, places, True),
              "bf16": _run(rank, places, True, WireDtype.BF16), "keys": list(places.keys),
              "route": _route(rank, places), "sum": _summed(rank, places)}
    torch.save(result, Path(out) / f"rank{rank}.pt")
    torch_dist.destroy_process_group()


def _worker3(rank: int, world: int, port: int, out: str) -> None:
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                  world_size=world)
    places = sites.build(DistEnv(launched=True, rank=rank, world_size=world, site=KEYS3[rank]))
    result = {"sync": _run(rank, places, False, world=world), "overlap": _run(rank, places, True, world=world),
              "keys": list(places.keys), "sum": _summed(rank, places)}
    torch.save(result, Path(out) / f"rank{rank}.pt")
    torch_dist.destroy_process_group()


ROUTE_HEAD = 6  # elements sent as bfloat16; then one fp32 weight


def route_input(rank: int) -> torch.Tensor:
    """Values bfloat16 cannot hold (1 + k/1024 ...), so its rounding shows; the weight too."""
    head = torch.tensor([1 + (rank + 1) / 1024, -3.0 - rank / 512, 1e-3 * (rank + 1.37), 250.3 + rank,
                         7e-6 * (2 - rank), 1.0])
    return torch.cat([head, torch.tensor([1000.0 + rank / 3])])


def _route(rank: int, places: sites.Sites) -> list[torch.Tensor]:
    """The hierarchical route on fixed inputs, synchronous and overlapped; then the flat one."""
    out = []
    for route, async_op in ((places.route, False), (places.route, True), (Route(), True)):
        flight = route.start(route_input(rank), async_op, ROUTE_HEAD, torch.bfloat16)
        out.append(route.finish(flight).clone())
    return out


def _summed(rank: int, places: sites.Sites) -> torch.Tensor:
    """A small float64 tensor summed over every rank by the route (the evaluation's sums on hier)."""
    return places.route.sum(torch.tensor([rank + 1.0, 2.0 ** rank, 0.25 * rank], dtype=torch.float64))


def route_expected() -> torch.Tensor:
    """fp32 sums inside each site, then the bfloat16 sum of the sites' heads (each cast, summed,
    rounded: gloo's bfloat16 sum), cast back; the weight summed in fp32."""
    sums = [sum(route_input(r) for r in ranks) for ranks in SITES]
    head = sum(s[:ROUTE_HEAD].bfloat16().float() for s in sums).bfloat16().float()
    return torch.cat([head, sum(s[ROUTE_HEAD:] for s in sums)])


def reference(overlap: bool, layout: tuple[tuple[int, ...], ...] = SITES
              ) -> tuple[list[list[list[torch.Tensor]]], list[list[torch.Tensor]], list[torch.Tensor]]:
    """One process, float64: per step, each site's parameters after its inner step ("before"
    the outer step) and every rank's parameters after it; then the flushed model."""
    start = network().double()
    outer = Outer(params(start))
    models = [copy.deepcopy(start) for _ in layout]
    opts = [torch.optim.SGD(m.parameters(), lr=INNER_LR, momentum=INNER_MU) for m in models]
    weights, pending = [0] * len(layout), None
    inner, after = [], []

    def round_mean() -> list[torch.Tensor]:
        total = sum(weights)
        return [sum(w * (a - p) for w, p in zip(weights, ps)) / total
                for a, *ps in zip(outer.x, *(params(m) for m in models))]

    def restart() -> None:
        for m in models:
            with torch.no_grad():
                for p, a in zip(m.parameters(), outer.x):
                    p.copy_(a)
        weights[:] = [0] * len(layout)

    for step in range(STEPS):
        for s, ranks in enumerate(layout):  # the site's joined batch, its mean loss
            x = torch.cat([batch(r, step)[0] for r in ranks]).double()
            y = torch.cat([batch(r, step)[1] for r in ranks])
            F.cross_entropy(models[s](x), y).backward()
            opts[s].step()
            opts[s].zero_grad()
            weights[s] += len(y)
        inner.append([params(m) for m in models])
        if (step + 1) % H == 0:
            g = round_mean()
            if overlap:
                if pending is not None:
                    outer.step(pending)
                pending = g
            else:
                outer.step(g)
            restart()
        after.append([t.clone() for t in outer.x] if (step + 1) % H == 0 else None)
    g = round_mean()  # the flush: the pending round, then the partial one
    if pending is not None:
        outer.step(pending)
    outer.step(g)
    return inner, after, outer.x


def test_layout_orders_sites_by_their_lowest_rank() -> None:
    assert sites.layout(["office", "home", "office"]) == ((0, 2), (1,))
    assert sites.layout(["host:a"] * 3) == ((0, 1, 2),)
    assert sites.site_key(DistEnv(launched=True, host="gpu3")) == "host:gpu3"
    assert sites.site_key(DistEnv(launched=True, host="gpu3", site="home")) == "home"


def test_site_peers_scale_each_loss_to_the_sites_mean() -> None:
    steps = global_steps()[:1]  # sizes 2, 5, 3
    assert micro_steps(steps, 0, 1, (0, 2)) == [MicroStep(2, 2 / 5, True, 10)]
    assert micro_steps(steps, 1, 1, (1,)) == [MicroStep(5, 1 / 5, True, 10)]
    assert micro_steps(steps, 0, 1) == [MicroStep(2, 3 / 10, True, 10)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One run of the 3 ranks for every assertion below (forking torch ranks is the cost)."""
    out = tmp_path_factory.mktemp("hier")
    fork_ranks(_worker, WORLD, str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.fixture(scope="module")
def ranks3(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("hier3")
    fork_ranks(_worker3, len(KEYS3), str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(len(KEYS3))]


def assert_exact(ranks: list[dict], keys: tuple[str, ...], layout: tuple[tuple[int, ...], ...]) -> None:
    """Every rank's every step, synchronous and overlapped, against the float64 reference."""
    assert ranks[0]["keys"] == list(keys)
    site_of = {r: s for s, members in enumerate(layout) for r in members}
    for variant in ("sync", "overlap"):
        inner, after, flushed = reference(variant == "overlap", layout)
        for r in range(len(keys)):
            got = ranks[r][variant]
            assert got["peers"] == list(layout[site_of[r]])
            for step, rec in enumerate(got["records"]):
                assert close(rec["before"], inner[step][site_of[r]]) <= 1e-6, (variant, r, step)
                expected = after[step] if after[step] is not None else rec["before"]
                assert close(rec["after"], expected) <= 1e-6, (variant, r, step)
            assert close(got["flushed"], flushed) <= 1e-6, (variant, r)
        # The sites really trained apart inside a round, and each site's ranks together.
        mid = [ranks[r][variant]["records"][1]["after"] for r in range(len(keys))]
        for r in range(len(keys)):
            for q in range(len(keys)):
                together = site_of[r] == site_of[q]
                assert (close(mid[r], mid[q]) == 0.0) if together else (close(mid[r], mid[q]) > 1e-3), (r, q)


@pytest.mark.slow
def test_hierarchical_update_equals_the_one_process_reference(ranks: list[dict]) -> None:
    assert_exact(ranks, KEYS, SITES)


@pytest.mark.slow
def test_three_places_update_equals_the_one_process_reference(ranks3: list[dict]) -> None:
    """Office, home and a rented pair (2 + 1 + 2 ranks, each pair not adjacent): the outer
    all-reduce runs over three representatives, the sample-weighted mean is still exact; so is the
    evaluation's route sum over all five ranks."""
    assert_exact(ranks3, KEYS3, SITES3)
    for r in range(len(KEYS3)):
        assert ranks3[r]["sum"].tolist() == [15.0, 31.0, 0.25 * 10], r


@pytest.mark.slow
def test_bf16_wire_sums_the_sites_in_bfloat16_and_the_weights_exactly(ranks: list[dict]) -> None:
    """The route's arithmetic bit for bit; then training with it: the flushed model is not the
    fp32 run's, and differs from it by a bfloat16-sized part of how far training moved it."""
    expected = route_expected()
    assert not torch.equal(expected[:ROUTE_HEAD], sum(route_input(r) for r in range(WORLD))[:ROUTE_HEAD])
    for r in range(WORLD):
        for got in ranks[r]["route"][:2]:
            assert torch.equal(got, expected), (r, got, expected)
    # Flat: gloo's ring sums 3 ranks' bfloat16 in its own order (not modelled bit for bit), but
    # every rank gets the same bits, within bfloat16's rounding, and the weight exactly.
    flat, exact = [ranks[r]["route"][2] for r in range(WORLD)], sum(route_input(r) for r in range(WORLD))
    assert all(torch.equal(f, flat[0]) for f in flat)
    assert ((flat[0] - exact).abs() <= exact.abs() / 64)[:ROUTE_HEAD].all() and flat[0][-1] == exact[-1]
    assert not torch.equal(flat[0][:ROUTE_HEAD], exact[:ROUTE_HEAD])
    for r in range(WORLD):
        bf16, fp32 = ranks[r]["bf16"], ranks[r]["overlap"]
        gap, moved = close(bf16["flushed"], fp32["flushed"]), close(fp32["flushed"], params(network()))
        # Each round's sum is rounded twice (2^-8 relative); Nesterov's momentum carries rounds on.
        assert 0 < gap <= moved / 64, (r, gap, moved)
    assert close(ranks[0]["bf16"]["flushed"], ranks[1]["bf16"]["flushed"]) == 0.0


@pytest.mark.slow
def test_route_sums_small_tensors_over_every_rank(ranks: list[dict]) -> None:
    """Route.sum (the evaluation's sums on hier: inside each site, across the representatives,
    back inside): every rank holds the sum over all three ranks, the office's two not adjacent."""
    for r in range(WORLD):
        assert ranks[r]["sum"].tolist() == [1 + 2 + 3, 1 + 2 + 4, 0.25 * (0 + 1 + 2)], r
