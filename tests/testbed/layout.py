"""Names, addresses and state-dir paths of the simulated hosts.

Every kernel object the test bed creates carries the prefix ``mrt`` (namespaces
``mrt<i>``, veths ``mrt<i>h``, bridge ``mrtbr0``) so cleanup can find its own
leftovers by name and never touches anything else on the machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# A machine holds up to three clusters side by side, one per slot: the test runner's second and third
# workers run the tests that name no fixed address on slots 1 and 2 while the first runs the rest on
# slot 0 (tests/conftest.py). The cluster tests mostly wait: where the cores are not saturated, two
# chains of them set the suite's end (docs/scale.md). A process's slot is read once, from the
# environment, and every name, subnet, state dir and lock below follows it; slot 0 is the cluster
# every doc and recipe describes.
SLOT_ENV = "MESHRUN_TESTBED_SLOT"
SLOTS = ({"prefix": "mrt", "underlay": "10.77.0", "overlay": "10.78.0", "zt": "10.79.0", "state": ""},
         {"prefix": "mru", "underlay": "10.74.0", "overlay": "10.75.0", "zt": "10.76.0", "state": "-1"},
         {"prefix": "mrv", "underlay": "10.71.0", "overlay": "10.72.0", "zt": "10.73.0", "state": "-2"})


def slot_of_worker(worker: str, slots: int | None = None) -> int | None:
    """pytest-xdist's worker gwN stands on slot N; None past the last of `slots` (all of SLOTS by
    default), or for a non-worker."""
    slots = len(SLOTS) if slots is None else slots
    number = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else slots
    return number if number < slots else None


def _slot() -> int:
    """MESHRUN_TESTBED_SLOT if set, else pytest-xdist's worker gwN takes slot N (0 past the last):
    its subprocesses inherit either variable, and with it the same cluster."""
    raw = os.environ.get(SLOT_ENV)
    if raw is None:
        slot = slot_of_worker(os.environ.get("PYTEST_XDIST_WORKER", "gw0"))
        return 0 if slot is None else slot
    if raw not in {str(i) for i in range(len(SLOTS))}:
        raise ValueError(f"{SLOT_ENV}={raw!r}: expected one of 0..{len(SLOTS) - 1}")
    return int(raw)


SLOT = _slot()
PREFIX = SLOTS[SLOT]["prefix"]  # three letters: cleanup reads the index after them
BRIDGE = f"{PREFIX}br0"
UNDERLAY = SLOTS[SLOT]["underlay"]
OVERLAY = SLOTS[SLOT]["overlay"]
GATEWAY = f"{UNDERLAY}.1"
NS_IFNAME = "eth0"  # the host's LAN interface, as seen inside its namespace
WG_IFNAME = "wg0"
WG_PORT = 51820
ZT_OVERLAY = SLOTS[SLOT]["zt"]  # the real ZeroTier network (tests/testbed/zerotier.py)
ZT_IFNAME = f"zt{PREFIX}0"  # pinned with a devicemap: else derived from the network id
ZT_PORT = 9993
DEFAULT_STATE_DIR = Path(f"/tmp/meshrun-testbed{SLOTS[SLOT]['state']}")
LOCK_PATH = Path(f"/tmp/meshrun-testbed{SLOTS[SLOT]['state']}.lock")
MAX_HOSTS = 200  # 10 + i must stay a valid last octet

NETNS_RE = re.compile(rf"^{PREFIX}(\d+)$")
VETH_RE = re.compile(rf"^{PREFIX}(\d+)h$")


@dataclass(frozen=True)
class Host:
    """One simulated host: its names and addresses."""

    index: int

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def overlay_name(self) -> str:
        return f"h{self.index}-wg"

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        """Root-namespace end of the host's veth pair (a bridge port)."""
        return f"{PREFIX}{self.index}h"

    @property
    def address(self) -> str:
        return f"{UNDERLAY}.{10 + self.index}"

    @property
    def overlay_address(self) -> str:
        return f"{OVERLAY}.{10 + self.index}"

    @property
    def zt_address(self) -> str:
        return f"{ZT_OVERLAY}.{10 + self.index}"


def hosts(n: int) -> list[Host]:
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"number of hosts must be 1..{MAX_HOSTS}, got {n}")
    return [Host(i) for i in range(1, n + 1)]


@dataclass(frozen=True)
class StatePaths:
    """Files under the state dir. Namespaces share one filesystem, so every sshd
    needs its own config, host key, pid file and log."""

    root: Path

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def neighbour_sysctls(self) -> Path:
        """The machine's neighbour-table thresholds before up() raised them (network.py)."""
        return self.root / "neighbour-sysctls.json"

    def host_dir(self, host: Host) -> Path:
        return self.root / host.name

    def home(self, host: Host) -> Path:
        return self.host_dir(host) / "home"

    def sshd_config(self, host: Host) -> Path:
        return self.host_dir(host) / "sshd_config"

    def host_key(self, host: Host) -> Path:
        return self.host_dir(host) / "ssh_host_ed25519_key"

    def sshd_pid(self, host: Host) -> Path:
        return self.host_dir(host) / "sshd.pid"

    def sshd_log(self, host: Host) -> Path:
        return self.host_dir(host) / "sshd.log"

    def wg_key(self, host: Host) -> Path:
        return self.host_dir(host) / "wg.key"

    def wg_pid(self, host: Host) -> Path:
        return self.host_dir(host) / "wg.pid"

    def wg_log(self, host: Host) -> Path:
        return self.host_dir(host) / "wg.log"

    def zt_home(self, host: Host) -> Path:
        """The host's zerotier-one home (identity, planet, authtoken, networks.d)."""
        return self.host_dir(host) / "zerotier-one"

    def zt_pid(self, host: Host) -> Path:
        return self.host_dir(host) / "zerotier-one.pid"

    def zt_log(self, host: Host) -> Path:
        return self.host_dir(host) / "zerotier-one.log"

    @property
    def zt_state(self) -> Path:
        """The ZeroTier network (id, node ids) while it is up."""
        return self.root / "zerotier.json"

    def netns_hosts_file(self, host: Host) -> Path:
        # `ip netns exec` bind-mounts /etc/netns/<ns>/* over /etc/*: this becomes
        # the host's /etc/hosts (the state dir is not involved).
        return Path("/etc/netns") / host.netns / "hosts"
