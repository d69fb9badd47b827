"""What the machine needs before a simulated cluster can come up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

APT_PACKAGES = (
    "openssh-server", "rsync", "iproute2", "wireguard-go", "wireguard-tools",
    "iputils-ping", "iperf3", "iptables",
)

# tool -> Debian package providing it
_TOOLS = {
    "ip": "iproute2", "tc": "iproute2", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "nsenter": "util-linux", "unshare": "util-linux",
    "mount": "mount", "hostname": "hostname",
}
_WG_TOOLS = {"wireguard-go": "wireguard-go", "wg": "wireguard-tools"}
SSHD = Path("/usr/sbin/sshd")


def missing_requirements(*, wireguard: bool = True) -> list[str]:
    """Human-readable reasons the test bed cannot run here (empty: it can)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("must run as root (network namespaces, veths, tc, mounts)")
    tools = dict(_TOOLS, **(_WG_TOOLS if wireguard else {}))
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            reasons.append(f"`{tool}` not found (apt-get install {package})")
    if not SSHD.is_file():
        reasons.append(f"{SSHD} not found (apt-get install openssh-server)")
    if wireguard and not Path("/dev/net/tun").exists():
        reasons.append("/dev/net/tun missing (wireguard-go needs TUN)")
    return reasons
