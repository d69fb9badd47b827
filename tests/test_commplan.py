"""deploy/commplan.py: floors, PowerSGD sizes and the recommendation, by exact equality."""

from __future__ import annotations

from deploy.run.commplan import (CommPlan, Hook, HookFloor, HookSettings, hook_bytes, node_bandwidth,
                             plan, powersgd_elements, ring_floor_s)

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
    s = HookSettings(powersgd_rank=4, localsgd_period=4)
    b = 2_500_000.0  # 20 Mbit/s
    got = plan(b, 3, WIDE, s, budget_s=0.05)
    full = 4_505_640
    psgd = 4 * ((1024 + 64) * 4 + 1024 + 2048 * 4 + 1024 + 1034 * 4 + 10)
    assert got == CommPlan(
        nodes=3, bandwidth_bytes_s=b, gradient_bytes=full, budget_s=0.05,
        floors=(HookFloor(Hook.NONE, full, 4 / 3 * full / b),
                HookFloor(Hook.FP16, full / 2, 4 / 3 * (full / 2) / b),
                HookFloor(Hook.BF16, full / 2, 4 / 3 * (full / 2) / b),
                HookFloor(Hook.POWERSGD, psgd, 4 / 3 * psgd / b),
                HookFloor(Hook.LOCALSGD, full / 4, 4 / 3 * (full / 4) / b)),
        recommended=Hook.POWERSGD,
        reason="4.51 MB of gradients, 3 nodes, 20.0 Mbit/s per node: none 2403.0 ms > budget; "
               "fp16 1201.5 ms > budget; powersgd 40.0 ms <= budget 50.0 ms per step")


def test_fast_link_keeps_plain_all_reduce() -> None:
    got = plan(125_000_000.0, 3, DIGITS)
    assert got.recommended is Hook.NONE
    assert got.reason == ("0.20 MB of gradients, 3 nodes, 1000.0 Mbit/s per node: none 2.2 ms "
                          "<= budget 50.0 ms per step")
    assert got.floor_of(Hook.NONE).floor_s == 4 / 3 * 203_304 / 125_000_000.0


def test_nothing_fits_picks_the_lowest_floor() -> None:
    got = plan(1000.0, 2, WIDE, HookSettings(powersgd_rank=4, localsgd_period=1000), budget_s=0.05)
    assert got.recommended is Hook.LOCALSGD
    assert got.reason.endswith("no hook fits the budget 50.0 ms per step; localsgd has the lowest "
                               "floor, 4505.6 ms")


def test_node_bandwidth_is_each_hosts_best_link_then_the_slowest_host() -> None:
    links = [("h1", 40.0), ("h1", 20.0), ("h2", 30.0), ("h2", None), ("h3", 45.0), ("h3", 10.0)]
    assert node_bandwidth(links) == 30.0 * 1e6 / 8
    assert node_bandwidth([("h1", None)]) is None
