"""`fab setup` on a simulated host: a real venv, the controller's meshrun wheel pushed and
installed by pip, and check-network telling a host with another build of meshrun apart.

The venv reuses the test interpreter's packages (`--reuse-site`) so no host downloads torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from meshrun.deploy.edges.wheel import controller_identity
from tests.fabrun import fab

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]

BASE = getattr(sys, "_base_executable", sys.executable)
VENV_PYTHON = "/root/meshrun/.venv/bin/python"
WHERE = ("import json, meshrun, os; from meshrun.deploy.host.facts import meshrun_identity; "
         "print(json.dumps([meshrun.__file__, meshrun_identity()]))")


def test_setup_installs_the_controllers_meshrun_once_and_check_network_sees_skew(
        testbed, make_inventory, tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # the controller's wheel cache, not ~/.cache
    inventory = str(make_inventory(host_overrides={"h2": {"python": VENV_PYTHON}}))
    args = ["setup", "--inventory", inventory, "--hosts", "h2", "--base", BASE, "--reuse-site", sys.executable]
    mine = controller_identity()
    first = fab(*args, timeout=600, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "h2: created venv /root/meshrun/.venv" in first.stdout
    assert f"installed meshrun (build {mine.build}) from the controller's wheel" in first.stdout
    assert f"meshrun {mine}, python {VENV_PYTHON} (torch 2." in first.stdout
    assert "set `python:" not in first.stderr  # the inventory already points at the venv
    assert list((tmp_path / "cache/meshrun/wheels" / mine.build).glob("meshrun-*-py3-none-any.whl"))

    # The venv imports meshrun from its own site-packages (the wheel), not from this checkout.
    seen = testbed.exec(2, [VENV_PYTHON, "-c", WHERE])
    path, identity = json.loads(seen.stdout)
    assert path.startswith("/root/meshrun/.venv/lib/") and "site-packages/meshrun/" in path
    assert identity == {"version": mine.version, "build": mine.build}
    assert testbed.exec(1, ["test", "-e", "/root/meshrun/.venv"], check=False).returncode != 0  # h2 only

    again = fab(*args, timeout=600, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "h2: already set up, nothing to do" in again.stdout

    # Another build on the host (one changed module): check-network names the skew, FAIL.
    tamper = ("import meshrun.deploy.host.agent as a, pathlib; p = pathlib.Path(a.__file__); "
              "p.write_text(p.read_text() + '# changed on the host\\n')")
    testbed.exec(2, [VENV_PYTHON, "-c", tamper])
    skewed = fab("check-network", "--json", "--inventory", inventory, "--hosts", "h1,h2", timeout=300, env=env)
    assert skewed.returncode == 1, skewed.stdout + skewed.stderr
    findings = [f for f in json.loads(skewed.stdout)["findings"] if f["where"] == "h2"]
    assert len(findings) == 1 and findings[0]["level"] == "FAIL", findings
    assert findings[0]["message"].startswith(f"version skew: the host runs meshrun {mine.version} (build ")
    assert findings[0]["message"].endswith(f", this controller {mine}; run `fab setup --hosts h2` (it installs "
                                           f"this controller's meshrun {mine})")

    # setup sees through its own stamp (the venv no longer holds the build it installed) and repairs it.
    repaired = fab(*args, timeout=600, env=env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"installed meshrun (build {mine.build})" in repaired.stdout
    clean = fab("check-network", "--json", "--inventory", inventory, "--hosts", "h1,h2", timeout=300, env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert [h["fingerprint"]["meshrun"] for h in json.loads(clean.stdout)["hosts"]] == [str(mine)] * 2
