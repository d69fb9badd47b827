"""What the test bed's network profiles deliver, and what the NFQUEUE delayer costs.

For each profile (tests/testbed/latency.py) on 3 simulated hosts:
  RTT    median of 9 `ping -U` h1 -> h2, and controller -> h2;
  TCP    one iperf3 stream h1 -> h2 (first seconds omitted: slow start);
  CPU    the delayers' CPU time during that transfer, as a share of one core
         (h2's delays the data, h1's the ACKs).
Two more rows probe the delayer itself:
  far x3      three streams at once in a ring (h1->h2, h2->h3, h3->h1): every
              delayer handles data and ACKs, as during an all-reduce;
  ceiling     no rate limit, 20 ms RTT: the most one delayer lets through.
Ratios: measured / profile target, and throughput / lan's (baseline, same run).

Usage: sudo .venv/bin/python bench/latency_profiles.py
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.testbed import SimCluster, latency, measure  # noqa: E402
from tests.testbed.latency import Profile  # noqa: E402
from tests.testbed.lock import exclusive  # noqa: E402

IPERF = {"lan": (3, 0), "home": (6, 2), "far": (10, 3), "ceiling": (5, 1)}
RING = [(2, 1), (3, 2), (1, 3)]  # (server, client)


@dataclass(frozen=True)
class Row:
    label: str
    profile: Profile
    rtt_ms: float
    controller_rtt_ms: float
    mbit: float  # per stream (mean over streams)
    cpu_share: float  # sum over all delayers, share of one core


def _delayer_cpu(cluster: SimCluster) -> float:
    pids = [latency.delayer_pid(h, cluster.paths) for h in cluster.hosts]
    return sum(measure.cpu_seconds(pid) for pid in pids if pid is not None)


def one(cluster: SimCluster, label: str, profile: Profile, ring: bool = False) -> Row:
    latency.apply(cluster.hosts, cluster.paths, profile)
    try:
        peers = measure.ping(cluster, 1, cluster.host(2).address)
        controller = measure.ping(None, 0, cluster.host(2).address)
        seconds, omit = IPERF[profile.name]
        pairs = RING if ring else RING[:1]
        cpu0, t0 = _delayer_cpu(cluster), time.monotonic()
        with ThreadPoolExecutor(len(pairs)) as pool:
            transfers = list(pool.map(lambda p: measure.iperf(
                cluster, p[0], p[1], cluster.host(p[0]).address, seconds=seconds, omit=omit), pairs))
        cpu = (_delayer_cpu(cluster) - cpu0) / (time.monotonic() - t0)
    finally:
        latency.clear(cluster.hosts, cluster.paths)
    mbit = sum(t.received_bits_per_second for t in transfers) / len(transfers) / 1e6
    return Row(label, profile, peers.median_ms, controller.median_ms, mbit, cpu)


def print_table(rows: list[Row]) -> None:
    lan = rows[0].mbit
    print(f"{'profile':>8}  {'RTT ms':>7} {'target':>6} {'ratio':>5}  {'ctl RTT':>7}  "
          f"{'Mbit/s':>7} {'target':>6} {'ratio':>5}  {'÷ lan':>6}  {'delayer CPU':>11}")
    for r in rows:
        target_rtt = r.profile.rtt_ms
        rtt_ratio = f"{r.rtt_ms / target_rtt:5.2f}" if target_rtt else "    -"
        rate = r.profile.rate_mbit
        rate_txt = f"{rate:>6}" if rate else "     -"
        rate_ratio = f"{r.mbit / rate:5.2f}" if rate else "    -"
        print(f"{r.label:>8}  {r.rtt_ms:7.2f} {target_rtt:6.0f} {rtt_ratio}  {r.controller_rtt_ms:7.2f}  "
              f"{r.mbit:7.1f} {rate_txt} {rate_ratio}  {r.mbit / lan:6.4f}  {r.cpu_share:10.1%}")


def main() -> int:
    cluster = SimCluster("/tmp/meshrun-testbed")
    with exclusive():
        cluster.up(3)
        try:
            rows = [one(cluster, p.name, p) for p in latency.PROFILES]
            rows.append(one(cluster, "far x3", latency.lookup("far"), ring=True))
            rows.append(one(cluster, "ceiling", Profile("ceiling", rate_mbit=None, rtt_ms=20.0)))
        finally:
            cluster.down()
    print_table(rows)
    print("Mbit/s: TCP payload received per stream (tbf counts Ethernet frames: payload "
          "<= 95.6 % of the rate); delayer CPU: all three delayers, share of one core.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
