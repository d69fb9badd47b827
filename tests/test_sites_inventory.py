"""`site:` in the inventory (docs/sites.md): per host, per group (`{hosts: [...], site: NAME}`) or in
`defaults`, a host's own winning; plain names only, one exact line for every bad value; carried
into the launch plan as MESHRUN_SITE. Pure: exact equality."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch

SITES = """\
defaults: {site: cloud}
hosts:
  gpu1: {address: 10.0.0.1}
  gpu2: {address: 10.0.0.2}
  home: {address: 10.0.0.3, site: kitchen}
  rented: {address: 10.0.0.4}
  lone: {address: 10.0.0.5}
groups:
  office: {hosts: [gpu1, gpu2, home], site: office}
  all: [gpu1, rented]
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return load_inventory(path)


def test_sites_come_from_the_host_its_group_or_the_defaults(tmp_path: Path) -> None:
    inv = load(tmp_path, SITES)
    assert {h.name: h.site for h in inv.hosts} == {
        "gpu1": "office", "gpu2": "office", "home": "kitchen", "rented": "cloud", "lone": "cloud"}
    assert dict(inv.groups) == {"office": ("gpu1", "gpu2", "home"), "all": ("gpu1", "rented")}
    assert load(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\n").hosts[0].site is None


def test_a_host_in_groups_at_two_sites_takes_its_own(tmp_path: Path) -> None:
    """Two groups may give a host different sites when it writes its own `site:`: the advice of the
    error below ("give the host its own `site:`") is then followed, and its own wins."""
    text = ("hosts:\n  a: {address: 10.0.0.1, site: z}\n  b: {address: 10.0.0.2}\n"
            "groups:\n  lab: {hosts: [a, b], site: x}\n  den: {hosts: [a], site: y}\n")
    assert {h.name: h.site for h in load(tmp_path, text).hosts} == {"a": "z", "b": "x"}


def test_the_plan_gives_each_declared_host_its_site(tmp_path: Path) -> None:
    inv = load(tmp_path, "hosts:\n  a: {address: 10.0.0.1, site: office}\n  b: {address: 10.0.0.2}\n")
    plan = plan_launch(Selection(inv.hosts, Rendezvous("a", 29400)), LaunchOptions("r1"), {}, "/py")
    envs = {h.host.name: dict(h.env) for h in plan.hosts}
    assert envs["a"]["MESHRUN_SITE"] == "office" and "MESHRUN_SITE" not in envs["b"]


BAD = [
    ("hosts:\n  a: {address: 10.0.0.1, site: 'my office'}\n",
     "2: host 'a', field 'site': site name 'my office' has characters other than letters, digits, '.', '_' and '-'; "
     "rename the site"),
    ("hosts:\n  a: {address: 10.0.0.1, site: [x]}\n",
     "2: host 'a', field 'site': expected a site name, got a list; write a site name"),
    ("hosts:\n  a: {address: 10.0.0.1, site: }\n",
     "2: host 'a', field 'site': expected a site name, got nothing; write e.g. `site: office`, or remove the line"),
    ("hosts:\n  a: {address: 10.0.0.1, site: \"\\e[31m\"}\n",
     "2: host 'a', field 'site': site name '\\x1b[31m' has characters other than letters, digits, '.', '_' and '-'; "
     "rename the site"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  lab: {hosts: [a], site: x, sight: y}\n",
     "4: field 'groups': unknown key 'sight' in group 'lab'; did you mean 'site'?"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  lab: {site: x}\n",
     "4: field 'groups': group 'lab' has no `hosts:`; write `{hosts: [gpu1, gpu2], site: office}`"),
    ("hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  lab: {hosts: [a], site: x}\n  den: {hosts: [a], site: y}\n",
     "5: field 'groups': host 'a' is in group 'lab' at site 'x' and in group 'den' at site 'y'; "
     "give the host its own `site:`, or one group"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[f"case{i}" for i in range(len(BAD))])
def test_a_bad_site_is_one_exact_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, text)
    assert str(info.value) == f"{tmp_path / 'inv.yaml'}:{expected}"
    assert info.value.exit_code == 2
