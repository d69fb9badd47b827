"""deploy/run/commplan.py: floors, PowerSGD sizes and the recommendation, by exact equality."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.run.commplan import (MAX_MBIT_S, MAX_RTT_MS, MIN_MBIT_S, CommPlan, Hook, HookFloor, HookSettings,
                             hook_bytes, link_rtt, node_bandwidth, plan, powersgd_elements, ring_floor_s)

# digits MLP 64-256-128-10
DIGITS = [[256, 64], [256], [128, 256], [128], [10, 128], [10]]
WIDE = [[1024, 64], [1024], [1024, 1024], [1024], [10, 1024], [10]]


def test_ring_floor_is_2_n_minus_1_over_n_s_over_b() -> None:
    assert ring_floor_s(3_000_000, 3, 1_000_000) == 4.0
    assert ring_floor_s(1_000_000, 2, 1_000_000) == 1.0
    assert ring_floor_s(1_000_000, 1, 1_000_000) == 0.0


def test_powersgd_elements_follow_torch_compression_rule() -> None:
    assert powersgd_elements([1024, 1024], 4) == (1024 + 1024) * 4
    assert powersgd_elements([256, 64], 4) == (256 + 64) * 4
    assert powersgd_elements([16, 3, 3, 3], 2) == (16 + 27) * 2  # conv: trailing dims flattened
    assert powersgd_elements([10, 8], 4) == 80  # (10+8)*4*2 >= 80: sent uncompressed
    assert powersgd_elements([256], 4) == 256  # vectors are never compressed
    assert powersgd_elements([10, 1024], 32) == 10240  # r = min(32, 10): no gain, uncompressed


def test_hook_bytes() -> None:
    s = HookSettings(powersgd_rank=4, localsgd_period=8)
    full = 4 * (1024 * 64 + 1024 + 1024 * 1024 + 1024 + 10 * 1024 + 10)
    assert hook_bytes(Hook.NONE, WIDE, s) == full == 4_505_640
    assert hook_bytes(Hook.FP16, WIDE, s) == hook_bytes(Hook.BF16, WIDE, s) == full / 2
    assert hook_bytes(Hook.LOCALSGD, WIDE, s) == full / 8
    assert hook_bytes(Hook.POWERSGD, WIDE, s) == 4 * ((1024 + 64) * 4 + 1024 + 2048 * 4 + 1024
                                                      + 1034 * 4 + 10)


def test_slow_link_recommends_powersgd_with_its_reason() -> None:
    s = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)
    b = 2_500_000.0  # 20 Mbit/s
    got = plan(b, 3, WIDE, s, budget_s=0.05)
    full = 4_505_640
    psgd = 4 * ((1024 + 64) * 4 + 1024 + 2048 * 4 + 1024 + 1034 * 4 + 10)
    assert got == CommPlan(
        nodes=3, bandwidth_bytes_s=b, rtt_s=0.0, gradient_bytes=full, budget_s=0.05,
        floors=(HookFloor(Hook.NONE, full, 4 / 3 * full / b),
                HookFloor(Hook.FP16, full / 2, 4 / 3 * (full / 2) / b),
                HookFloor(Hook.BF16, full / 2, 4 / 3 * (full / 2) / b),
                HookFloor(Hook.POWERSGD, psgd, 4 / 3 * psgd / b),
                HookFloor(Hook.LOCALSGD, full / 4, 4 / 3 * (full / 4) / b),
                HookFloor(Hook.DILOCO, full / 8, 4 / 3 * (full / 8) / b),
                HookFloor(Hook.DILOCO_OVERLAP, full / 8, 4 / 3 * (full / 8) / b)),
        recommended=Hook.POWERSGD,
        reason="4.51 MB of gradients, 3 nodes, 20.0 Mbit/s per node, RTT 0.0 ms: none 2403.0 ms > budget; "
               "fp16 1201.5 ms > budget; powersgd 40.0 ms <= budget 50.0 ms per step")


def test_latency_counts_per_bucket_and_twice_for_powersgd() -> None:
    """The issue's `home` link (20 Mbit/s, 40 ms RTT) with the digits MLP: by bandwidth alone
    PowerSGD looked cheapest per step; its two latency-bound all-reduces make it the slowest of the
    compressing hooks, and a periodic method is what fits the budget."""
    s = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=8)
    b, rtt, n = 2_500_000.0, 0.040, 3
    got = plan(b, n, DIGITS, s, budget_s=0.05, rtt_s=rtt)
    full = 203_304
    psgd = 4 * ((256 + 64) * 4 + 256 + (128 + 256) * 4 + 128 + (10 + 128) * 4 + 10)
    ring = 2 * (n - 1)  # steps of one ring all-reduce, each one one-way delay (RTT/2)
    expect = {Hook.NONE: 4 / 3 * full / b + ring * rtt / 2,
              Hook.FP16: 4 / 3 * full / 2 / b + ring * rtt / 2,
              Hook.POWERSGD: 4 / 3 * psgd / b + 2 * ring * rtt / 2,
              Hook.LOCALSGD: (4 / 3 * full / b + ring * rtt / 2) / 4,
              Hook.DILOCO: (4 / 3 * full / b + ring * rtt / 2) / 8}
    for hook, floor in expect.items():
        assert abs(got.floor_of(hook).floor_s - floor) < 1e-12, hook
    assert got.floor_of(Hook.POWERSGD).latency_s == 2 * ring * rtt / 2
    assert got.floor_of(Hook.POWERSGD).floor_s > got.floor_of(Hook.FP16).floor_s
    assert got.recommended is Hook.LOCALSGD
    assert got.reason == ("0.20 MB of gradients, 3 nodes, 20.0 Mbit/s per node, RTT 40.0 ms: none 188.4 ms > "
                          "budget; fp16 134.2 ms > budget; powersgd 168.0 ms > budget; localsgd 47.1 ms <= budget "
                          "50.0 ms per step")


def test_big_models_pay_the_latency_once_per_bucket() -> None:
    shapes = [[4096, 4096]] * 4  # 256 MiB of fp32 gradients: 11 buckets of 25 MiB
    got = plan(1e9, 2, shapes, HookSettings(), rtt_s=0.1)
    assert got.floor_of(Hook.NONE).latency_s == 11 * 2 * 1 * 0.1 / 2


def test_when_no_per_step_method_fits_diloco_is_recommended() -> None:
    """`far` (50 Mbit/s, 150 ms): every per-step method and local SGD every 4 steps blow the
    budget; DiLoCo's one all-reduce every H steps fits."""
    s = HookSettings(powersgd_rank=4, localsgd_period=4, diloco_inner_steps=64)
    got = plan(6_250_000.0, 3, WIDE, s, budget_s=0.05, rtt_s=0.150)
    assert got.recommended is Hook.DILOCO
    assert got.floor_of(Hook.DILOCO).floor_s <= 0.05 < got.floor_of(Hook.LOCALSGD).floor_s


def test_fast_link_keeps_plain_all_reduce() -> None:
    got = plan(125_000_000.0, 3, DIGITS)
    assert got.recommended is Hook.NONE
    assert got.reason == ("0.20 MB of gradients, 3 nodes, 1000.0 Mbit/s per node, RTT 0.0 ms: none 2.2 ms "
                          "<= budget 50.0 ms per step")
    assert got.floor_of(Hook.NONE).floor_s == 4 / 3 * 203_304 / 125_000_000.0


def test_nothing_fits_picks_the_lowest_floor() -> None:
    got = plan(1000.0, 2, WIDE, HookSettings(powersgd_rank=4, localsgd_period=1000, diloco_inner_steps=500),
               budget_s=0.05)
    assert got.recommended is Hook.LOCALSGD
    assert got.reason.endswith("no hook fits the budget 50.0 ms per step; localsgd has the lowest "
                               "floor, 4505.6 ms")


def test_node_bandwidth_is_each_hosts_best_link_then_the_slowest_host() -> None:
    links = [("h1", 40.0), ("h1", 20.0), ("h2", 30.0), ("h2", None), ("h3", 45.0), ("h3", 10.0)]
    assert node_bandwidth(links) == 30.0 * 1e6 / 8
    assert node_bandwidth([("h1", None)]) is None


def test_a_hosts_absurd_link_measurements_keep_every_floor_finite(tmp_path) -> None:
    """A link probe may report any finite number: `mbit_s: 5e-324` made every floor infinite and
    commplan.json hold Infinity, which load_plan then refused; `1e308` overflowed the bandwidth."""
    from meshrun.deploy.edges.comm import load_plan, save_plan

    assert node_bandwidth([("h1", 5e-324), ("h2", 100.0)]) == MIN_MBIT_S * 1e6 / 8 == 125.0
    assert node_bandwidth([("h1", 1e308), ("h2", 10**300)]) == MAX_MBIT_S * 1e6 / 8
    assert link_rtt([0.5, 1e308]) == MAX_RTT_MS / 1e3 == 600.0
    got = plan(node_bandwidth([("h1", 5e-324)]), 2, DIGITS, rtt_s=link_rtt([1e308]))
    assert got.floor_of(Hook.NONE).floor_s == 203_304 / 125 + 600.0
    assert save_plan(tmp_path, "r1", got, "none").read_text().count("Infinity") == 0
    assert load_plan(tmp_path, "r1")["bandwidth_bytes_s"] == 125.0


def test_a_plan_with_a_number_that_is_not_finite_is_not_written(tmp_path) -> None:
    from meshrun.deploy.edges.comm import save_plan

    broken = dataclasses.replace(plan(125e6, 2, DIGITS), bandwidth_bytes_s=math.inf)
    with pytest.raises(MeshrunError) as info:
        save_plan(tmp_path, "r1", broken, "none")
    path = tmp_path / "r1" / "commplan.json"
    assert str(info.value) == f"--comm: the plan holds a number that is not finite; {path} not written"
    assert not path.exists()
