"""What the machine needs before a simulated cluster can come up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

APT_PACKAGES = (
    "openssh-server", "rsync", "iproute2", "wireguard-go", "wireguard-tools",
    "iputils-ping", "iperf3", "iptables",
    "libnetfilter-queue-dev", "build-essential",  # network profiles compile their delayer (delayer.c)
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


CC = "gcc"  # compiles the network profiles' delayer (latency.build_delayer)
NFQUEUE_HEADER = Path("/usr/include/libnetfilter_queue/libnetfilter_queue.h")


def missing_latency_requirements(cc: str = CC, header: Path = NFQUEUE_HEADER) -> list[str]:
    """What network profiles (latency.py) need on top of the bed: iptables' NFQUEUE
    target, and a C compiler and libnetfilter-queue to build the delayer."""
    reasons = []
    if shutil.which("iptables") is None:
        reasons.append("`iptables` not found (apt-get install iptables)")
    if shutil.which(cc) is None:
        reasons.append(f"`{cc}` not found (apt-get install build-essential)")
    if not header.is_file():
        reasons.append(f"{header} not found (apt-get install libnetfilter-queue-dev)")
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
