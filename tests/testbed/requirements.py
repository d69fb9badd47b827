"""What the machine needs before a simulated cluster can come up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

APT_PACKAGES = (
    "openssh-server", "rsync", "iproute2", "wireguard-go", "wireguard-tools",
    "iputils-ping", "iperf3", "iptables",
    "libnetfilter-queue-dev",  # for `pip install netfilterqueue` (network profiles' delayer)
)

# tool -> Debian package providing it
_TOOLS = {
    "ip": "iproute2", "tc": "iproute2", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "nsenter": "util-linux", "unshare": "util-linux",
    "mount": "mount", "hostname": "hostname",
}
_WG_TOOLS = {"wireguard-go": "wireguard-go", "wg": "wireguard-tools"}
SSHD = Path("/usr/sbin/sshd")
# The real ZeroTier One daemon: a read-only copy beside the clone in CI (../shared/vendor/...),
# or wherever this variable points.
ZEROTIER_ENV = "MESHRUN_ZEROTIER_ONE"
REPO_ROOT = Path(__file__).resolve().parents[2]


def zerotier_binary(repo_root: Path = REPO_ROOT) -> Path:
    """Where the test bed takes `zerotier-one` from: $MESHRUN_ZEROTIER_ONE, else the vendored one."""
    override = os.environ.get(ZEROTIER_ENV)
    if override:
        return Path(override).absolute()
    return repo_root.parent / "shared" / "vendor" / "zerotier" / "zerotier-one"


def missing_latency_requirements(python: str = sys.executable) -> list[str]:
    """What network profiles (latency.py) need on top of the bed: iptables' NFQUEUE
    target and the `netfilterqueue` module in the python that runs the delayers."""
    reasons = []
    if shutil.which("iptables") is None:
        reasons.append("`iptables` not found (apt-get install iptables)")
    probe = subprocess.run([python, "-c", "import netfilterqueue"], capture_output=True, check=False)
    if probe.returncode != 0:
        reasons.append(f"{python} cannot import netfilterqueue (apt-get install "
                       "libnetfilter-queue-dev; pip install -e '.[test]')")
    return reasons


def missing_requirements(*, wireguard: bool = True, zerotier: bool = False,
                         latency: bool = False) -> list[str]:
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
    if (wireguard or zerotier) and not Path("/dev/net/tun").exists():
        reasons.append("/dev/net/tun missing (wireguard-go and zerotier-one need TUN)")
    if zerotier:
        binary = zerotier_binary()
        if not binary.is_file():
            reasons.append(f"no zerotier-one binary at {binary} (set {ZEROTIER_ENV} to a ZeroTier One 1.14 "
                           "binary, see ../shared/vendor/zerotier/README.md)")
    if latency:
        reasons += missing_latency_requirements()
    return reasons
