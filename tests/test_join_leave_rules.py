"""`fab join` / `fab leave` rules that need no host (deploy/commands/membership.py), exact equality:
the succession order a joiner walks, the elastic minimum a leave may not cross, and names only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshrun.deploy.commands.membership import below_minimum, join_or_leave, join_order, prepare_joiner
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer

INVENTORY = """\
hosts:
  h1: {address: 10.0.0.1}
  h2: {address: 10.0.0.2}
  h3: {address: 10.0.0.3}
  h4: {address: 10.0.0.4}
groups:
  grp: [h3, h4]
"""


def record(path: Path, hosts: tuple[str, ...] = ("h1", "h2", "h3")) -> RunRecord:
    return RunRecord("20261205-120000-abcd", str(path), hosts, 1.0, False, "10.0.0.1:29400", elastic=(2, 3))


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY)
    return path


def test_a_former_member_rejoins_at_its_old_place_in_the_succession_order(inventory: Path) -> None:
    """train h1,h2,h3; leave h2; join h2. Moved to the end, h2 would walk h1,h3,h2 while h1 and h3 walk
    h1,h2,h3: with h1 dead, h3 would look for the next store at h2 and h2 at h3, and neither hold one."""
    inv = load_inventory(inventory)
    h1, h2, h3, h4 = (inv.host(n) for n in ("h1", "h2", "h3", "h4"))
    assert [h.name for h in join_order((h1, h2, h3), h2)] == ["h1", "h2", "h3"]
    assert [h.name for h in join_order((h1, h2, h3), h4)] == ["h1", "h2", "h3", "h4"]


def test_a_leave_below_the_elastic_minimum_is_refused(inventory: Path) -> None:
    below_minimum(record(inventory), "h3", 3)  # 2 left: the minimum holds
    with pytest.raises(MeshrunError) as info:
        below_minimum(record(inventory), "h2", 2)
    assert str(info.value) == ("leaving h2 would leave 1 host(s) in run 20261205-120000-abcd, below its elastic "
                               "minimum of 2; end the whole run with fab stop --run 20261205-120000-abcd")


@pytest.mark.parametrize("name", ["grp", "h3:0"])
def test_join_and_leave_take_host_names_only(tmp_path: Path, inventory: Path, name: str) -> None:
    """A group or a GPU list was accepted and saved in the run record, where status, stop and fetch
    then failed on it."""
    with pytest.raises(InputError) as info:
        join_or_leave(Project(tmp_path, tmp_path / "runs"), record(inventory), "join", [name], Renderer())
    assert str(info.value) == f"--hosts '{name}': join and leave take host names, one by one (hosts: h1, h2, h3, h4)"


@pytest.mark.parametrize("endpoint", ["10.0.0.1:x", "10.0.0.1:", "10.0.0.1:99999", "10.0.0.1:０", "10.0.0.9:29400"])
def test_a_rendezvous_endpoint_the_join_cannot_use_is_one_line_before_any_host(inventory: Path,
                                                                               endpoint: str) -> None:
    """launch.json is checked for printable text only; a join read its port with int() after the
    joiner was connected and synced, and "10.0.0.1:x" ended as "internal error" (ValueError)."""
    run = dataclasses.replace(record(inventory, ("h1", "h2")), rdzv_endpoint=endpoint)
    loaded = load_inventory(inventory, inventory.parent)
    with pytest.raises(InputError) as err:
        prepare_joiner(run, loaded, "h3", Project(inventory.parent, inventory.parent / "runs"), Renderer(), False)
    assert str(err.value) == (f"run 20261205-120000-abcd: its rendezvous '{endpoint}' is no member's address and port "
                              f"in {inventory}; was the inventory changed?")
