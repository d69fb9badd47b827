"""ZeroTier in the test bed: what the real daemon costs, against the plain bridge in the same run.

On 3 simulated hosts (tests/testbed; needs root and ../shared/vendor/zerotier/zerotier-one or
$MESHRUN_ZEROTIER_ONE), one run each:
- bringing ZeroTier up: identities, private planet, controller, join, every pair pings, ONLINE;
- `fab check-network` wall time, on the LAN inventory and on the ZeroTier one;
- `fab train` (digits, 3 hosts, one process each) wall time, LAN vs ZeroTier;
- the don't-fragment edge over ztmrt0 (largest ICMP payload that passes, by bisection), and the
  ICMP round trip next to what `listpeers` calls `latency` (not a round trip: it is reported only
  to show how far apart the two are).

Usage: sudo .venv/bin/python bench/zerotier.py [--epochs 8] [--wait 900]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fabrun import fab  # noqa: E402
from tests.testbed import SimCluster  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402
from tests.testbed.zerotier import ZeroTier, api  # noqa: E402

HOSTS = 3


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.monotonic()
    result = action()
    return time.monotonic() - start, result


def checked(*args: str) -> Callable[[], object]:
    def run() -> object:
        done = fab(*args, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"fab {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return done
    return run


def df_edge(cluster: SimCluster, target: str, low: int = 1000, high: int = 9000) -> int:
    """Largest don't-fragment ICMP payload from h1 to `target` that gets an answer."""
    def passes(size: int) -> bool:
        argv = ["ping", "-M", "do", "-s", str(size), "-c", "1", "-W", "2", target]
        return cluster.exec(1, argv, check=False).returncode == 0
    assert passes(low) and not passes(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if passes(middle) else (low, middle)
    return low


def icmp_rtt_ms(cluster: SimCluster, target: str) -> float:
    out = cluster.exec(1, ["ping", "-c", "5", "-i", "0.2", "-q", target]).stdout
    return float(re.search(r"= [\d.]+/([\d.]+)/", out).group(1))  # type: ignore[union-attr]


def listpeers_latency_ms(zt: ZeroTier, cluster: SimCluster) -> int:
    peers = api(cluster.host(1), cluster.paths, "GET", "/peer")
    return next(p["latency"] for p in peers if p["address"] == zt.net.nodes[2])


def measure(cluster: SimCluster, epochs: int, tmp: Path) -> list[tuple[str, str, str, str]]:
    lan = cluster.write_inventory(tmp / "lan.yaml")
    zt = cluster.zerotier
    up_s, _ = timed(zt.up)
    try:
        overlay = cluster.write_inventory(tmp / "zt.yaml", use_zerotier=True)
        rows = [("ZeroTier up on 3 hosts (s)", "-", f"{up_s:.1f}", "-")]
        for what, args in (("fab check-network (s)", ("check-network",)),
                           (f"fab train digits, epochs={epochs} (s)", ("train", "--", f"epochs={epochs}"))):
            lan_s, _ = timed(checked(args[0], "--inventory", str(lan), *args[1:]))
            zt_s, _ = timed(checked(args[0], "--inventory", str(overlay), *args[1:]))
            rows.append((what, f"{lan_s:.1f}", f"{zt_s:.1f}", f"{zt_s / lan_s:.2f}"))
        rows.append(("largest DF ping payload h1->h2 (bytes)", str(df_edge(cluster, cluster.host(2).address)),
                     str(df_edge(cluster, cluster.host(2).zt_address)), "-"))
        rows.append(("ICMP RTT h1->h2 (ms)", f"{icmp_rtt_ms(cluster, cluster.host(2).address):.3f}",
                     f"{icmp_rtt_ms(cluster, cluster.host(2).zt_address):.3f}", "-"))
        rows.append(("listpeers `latency` h1->h2 (ms, not an RTT)", "-", str(listpeers_latency_ms(zt, cluster)), "-"))
    finally:
        zt.down()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--wait", type=float, default=900, help="seconds to wait for the test bed lock")
    args = parser.parse_args()
    cluster = SimCluster("/tmp/meshrun-testbed")
    with exclusive(timeout=args.wait), tempfile.TemporaryDirectory(prefix="meshrun-bench-zt-") as tmp:
        cluster.up(HOSTS)
        try:
            rows = measure(cluster, args.epochs, Path(tmp))
        finally:
            cluster.down()
    header = ("what", "lan (bridge)", "zerotier", "zerotier / lan")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
