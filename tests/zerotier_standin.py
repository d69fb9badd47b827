"""A stand-in `zerotier-cli`: THE ONE ALLOWED MOCK in meshrun's tests, kept only for what the real
daemon cannot show on this machine.

The test bed runs the real ZeroTier One daemon on every simulated host (tests/testbed/zerotier.py):
ONLINE/OK, OFFLINE, ACCESS_DENIED and a stopped daemon are all proven against it
(tests/test_zerotier_real.py). What cannot be made here is a peer RELAYED because the hosts sit
behind NATs (no NAT between the namespaces, and the only root is on the same bridge), and the
TCP fallback relay (ZeroTier's relay servers on the internet). For those, `install` writes
`~/bin/zerotier-cli` into one simulated host's private home: a tiny script that answers
`-j info|listnetworks|peers` with JSON recorded in the real format (tests/data/zerotier/<scenario>.json),
with that host's address and interface filled in, and the recorded peers renamed to the cluster's
real node ids, so the check's cross-checks see a consistent host. `recorded` also feeds the pure
verdict tests (tests/test_netcheck.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


def answers_for(scenario: str, address: str, device: str, nodes: Mapping[str, str] | None = None) -> dict:
    """The scenario as this host would print it: its address assigned, its device as the port, and
    recorded peer node ids renamed by `nodes` (recorded id -> a real node id)."""
    data = recorded(scenario)
    for network in data["listnetworks"]:
        if network["assignedAddresses"]:
            network["assignedAddresses"][0] = f"{address}/24"
        network["portDeviceName"] = device
    for peer in data["peers"]:
        peer["address"] = (nodes or {}).get(peer["address"], peer["address"])
    return data


def install(home: Path, scenario: str, address: str, device: str = "eth0",
            nodes: Mapping[str, str] | None = None) -> Path:
    """Write the stand-in into a simulated host's private home (`testbed.paths.home(host)`)."""
    path = home / "bin" / "zerotier-cli"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPT.format(answers=json.dumps(answers_for(scenario, address, device, nodes))))
    path.chmod(0o755)
    return path


def remove(home: Path) -> None:
    (home / "bin" / "zerotier-cli").unlink(missing_ok=True)
