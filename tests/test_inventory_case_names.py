"""Host names that differ only in case are refused at load (macos55 finding 6): a host's name is
a file name in the runs folder (logs/HOST.log, hosts/HOST/, .placed/HOST.json), and a macOS or
Windows disk is case-insensitive, so `gpu1` and `GPU1` shared one log, one fetched tree and one
placed record there. Group names are no file names, and
stay free (a group `Lab` beside a host `lab` loads). One exact line each, exit 2, as tests/test_inventory.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.shown import MESSAGE_MAX

REFUSED = [
    ("hosts:\n  gpu1: {address: 10.0.0.1}\n  GPU1: {address: 10.0.0.2}\n",
     "3: host 'GPU1': host name 'GPU1' differs from host 'gpu1' only in case; rename one: a macOS or Windows disk "
     "cannot tell their run files apart"),
    ("hosts:\n  Lab-A.x: {address: 10.0.0.1}\n  b: {address: 10.0.0.2}\n  lab-a.X: {address: 10.0.0.3}\n",
     "4: host 'lab-a.X': host name 'lab-a.X' differs from host 'Lab-A.x' only in case; rename one: a macOS or "
     "Windows disk cannot tell their run files apart"),
]


@pytest.mark.parametrize("text,expected", REFUSED, ids=["hosts", "hosts-apart"])
def test_names_equal_but_for_case_get_one_exact_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_inventory(path)
    # A long temporary path loses its middle (deploy/inventory/shown.with_path); the file name and line stay.
    assert str(info.value).endswith(f"{path.name}:{expected}") and len(str(info.value)) <= MESSAGE_MAX
    assert info.value.exit_code == 2


def test_names_that_differ_otherwise_still_load(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  gpu1: {address: 10.0.0.1}\n  gpu10: {address: 10.0.0.2}\n  GPU2: {address: 10.0.0.3}\n"
                    "groups:\n  lab: [gpu1, gpu10]\n  Lab2: [GPU2]\n  gpu: [gpu1]\n")
    inventory = load_inventory(path)
    assert [h.name for h in inventory.hosts] == ["gpu1", "gpu10", "GPU2"]
    assert dict(inventory.groups) == {"lab": ("gpu1", "gpu10"), "Lab2": ("GPU2",), "gpu": ("gpu1",)}
