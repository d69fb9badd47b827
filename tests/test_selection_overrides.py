"""`--hosts` GPU overrides against a second mention of the same host, and `--nnodes N` (a plain count)
against the hosts selected (bad-input findings 1 and 5).

`--hosts gpu1:0,lab` meant "GPU 0 of gpu1, and the rest of the lab": the group's plain mention of gpu1
replaced the override, and gpu1 trained on all four GPUs (a colleague's, a display card), silently;
`lab,gpu1:0` kept it. `gpu1:0,gpu1:1` quietly became GPU 1. `--nnodes 1` with two hosts was checked,
then dropped: both hosts ran. Pure: a real inventory file, the real `select_hosts`, `parse_nnodes`
and launch plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import ElasticBounds, Inventory
from meshrun.deploy.inventory.selection import parse_nnodes, select_hosts
from meshrun.deploy.run.plan import LaunchOptions, host_env

SEL = """\
hosts:
  gpu1: {address: 10.0.0.1, gpus: [0, 1, 2, 3]}
  gpu2: {address: 10.0.0.2, gpus: [0, 1]}
  cpu1: {address: 10.0.0.3, nproc: 2}
groups:
  lab: [gpu1, gpu2]
  all: [gpu2, gpu1, cpu1]
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    path = tmp_path / "sel.yaml"
    path.write_text(SEL)
    return load_inventory(path)


def chosen(inventory: Inventory, flag: str) -> list[tuple[str, tuple[int, ...] | None, int | None]]:
    return [(h.name, h.gpus, h.nproc) for h in select_hosts(inventory, flag).hosts]


@pytest.mark.parametrize("flag,expected", [
    ("gpu1:0,lab", [("gpu1", (0,), None), ("gpu2", (0, 1), None)]),  # was gpu1's (0, 1, 2, 3)
    ("lab,gpu1:0", [("gpu1", (0,), None), ("gpu2", (0, 1), None)]),  # the order the hosts are named in holds
    ("gpu1:0,gpu1", [("gpu1", (0,), None)]),
    ("gpu1,gpu1:2,3", [("gpu1", (2, 3), None)]),
    ("gpu1:1,all", [("gpu1", (1,), None), ("gpu2", (0, 1), None), ("cpu1", None, 2)]),
    ("lab:1,gpu2", [("gpu1", (1,), None), ("gpu2", (1,), None)]),  # a group's override holds too
    ("gpu1:0,gpu1:0", [("gpu1", (0,), None)]),  # the same override twice: nothing to choose between
    ("cpu1,all:0", [("cpu1", (0,), None), ("gpu2", (0,), None), ("gpu1", (0,), None)]),
])
def test_an_override_holds_against_a_plain_mention_in_either_order(inventory: Inventory, flag: str,
                                                                    expected: list) -> None:
    assert chosen(inventory, flag) == expected


def test_the_ranks_see_only_the_overridden_gpus(inventory: Inventory) -> None:
    """What the finding saw at the end of the chain: gpu1's CUDA_VISIBLE_DEVICES."""
    for flag in ("gpu1:0,lab", "lab,gpu1:0"):
        hosts = select_hosts(inventory, flag).hosts
        assert [(h.name, dict(host_env(h, LaunchOptions("r"), None))["CUDA_VISIBLE_DEVICES"]) for h in hosts] == [
            ("gpu1", "0"), ("gpu2", "0,1")]


@pytest.mark.parametrize("flag,expected", [
    ("gpu1:0,gpu1:1", "--hosts: gpu1 is given GPUs 0 and then 1; give it once"),
    ("gpu1:0,1,lab:2", "--hosts: gpu1 is given GPUs 0,1 and then 2; give it once"),
    ("lab:0,gpu2:1", "--hosts: gpu2 is given GPUs 0 and then 1; give it once"),
    ("gpu1:0,1,gpu1:1,0", "--hosts: gpu1 is given GPUs 0,1 and then 1,0; give it once"),  # the order is the ranks'
])
def test_two_different_overrides_for_one_host_are_refused_in_one_line(inventory: Inventory, flag: str,
                                                                      expected: str) -> None:
    with pytest.raises(InputError) as info:
        select_hosts(inventory, flag)
    assert (str(info.value), info.value.exit_code) == (expected, 2)


def test_plain_mentions_still_select_in_order_of_first_mention(inventory: Inventory) -> None:
    assert chosen(inventory, "gpu2,lab,gpu2") == [("gpu2", (0, 1), None), ("gpu1", (0, 1, 2, 3), None)]


NO_ELASTIC = Inventory(Path("inv.yaml"), (), {}, None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag,hosts,expected", [
    ("1", 2, "--nnodes '1': 2 hosts are selected; select 1 with --hosts, or give MIN:MAX for an elastic run"),
    ("2", 3, "--nnodes '2': 3 hosts are selected; select 2 with --hosts, or give MIN:MAX for an elastic run"),
    ("3", 2, "--nnodes '3': 2 hosts are selected; select 3 with --hosts, or give MIN:MAX for an elastic run"),
    ("2", 1, "--nnodes '2': 1 host is selected; select 2 with --hosts, or give MIN:MAX for an elastic run"),
    ("9" * 100, 2, f"--nnodes '{'9' * 40}'…: 2 hosts are selected; select {'9' * 40}… with --hosts, or give MIN:MAX "
                   "for an elastic run"),
])
def test_a_plain_nnodes_count_other_than_the_hosts_selected_is_refused(flag: str, hosts: int, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_nnodes(flag, NO_ELASTIC, hosts)
    assert (str(info.value), info.value.exit_code) == (expected, 2)


def test_a_plain_count_equal_to_the_hosts_is_a_fixed_run_as_before() -> None:
    elastic = Inventory(Path("inv.yaml"), (), {}, None, None, ElasticBounds(2, 3))  # type: ignore[arg-type]
    assert parse_nnodes("2", NO_ELASTIC, 2) is None
    assert parse_nnodes("3", elastic, 3) is None  # a count still says "fixed" over the inventory's `elastic:`
    assert parse_nnodes("1:3", NO_ELASTIC, 2) == ElasticBounds(1, 3)
    assert parse_nnodes(None, elastic, 1) == ElasticBounds(2, 3)
