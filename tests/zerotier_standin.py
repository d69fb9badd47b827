"""A stand-in `zerotier-cli` for the simulated hosts: THE ONE ALLOWED MOCK in meshrun's tests.

The ZeroTier daemon cannot run here (no route to ZeroTier's roots, no controller to authorize
nodes), so `install` writes `~/bin/zerotier-cli` into one simulated host's private home: a tiny
script that answers `-j info|listnetworks|peers` with JSON recorded in the real format
(tests/data/zerotier/<scenario>.json), with that host's address and interface filled in so the
check's cross-checks (address among assignedAddresses, portDeviceName vs. the route) see a
consistent host. `fab check-network` finds it because it searches ~/bin after PATH (see
deploy/probe_host.py), the same place a user puts a `sudo zerotier-cli` wrapper.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "zerotier"
SCENARIOS = ("ok", "offline", "access_denied", "relay")

SCRIPT = '''#!/usr/bin/python3
# meshrun test stand-in for zerotier-cli (tests/zerotier_standin.py): recorded JSON, no daemon.
import json, sys
ANSWERS = json.loads({answers!r})
args = [a for a in sys.argv[1:] if a != "-j"]
if "-j" not in sys.argv or len(args) != 1 or args[0] not in ANSWERS:
    print("stand-in zerotier-cli: only -j info|listnetworks|peers", file=sys.stderr)
    sys.exit(2)
print(json.dumps(ANSWERS[args[0]], indent=2))
'''


def recorded(scenario: str) -> dict:
    """The recorded outputs of one scenario: {"info": ..., "listnetworks": [...], "peers": [...]}."""
    return json.loads((DATA / f"{scenario}.json").read_text())


def answers_for(scenario: str, address: str, device: str) -> dict:
    """The scenario as this host would print it: its address assigned, its device as the port."""
    data = recorded(scenario)
    for network in data["listnetworks"]:
        if network["assignedAddresses"]:
            network["assignedAddresses"][0] = f"{address}/24"
        network["portDeviceName"] = device
    return data


def install(home: Path, scenario: str, address: str, device: str = "eth0") -> Path:
    """Write the stand-in into a simulated host's private home (`testbed.paths.home(host)`)."""
    path = home / "bin" / "zerotier-cli"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT.format(answers=json.dumps(answers_for(scenario, address, device))))
    path.chmod(0o755)
    return path


def remove(home: Path) -> None:
    (home / "bin" / "zerotier-cli").unlink(missing_ok=True)
