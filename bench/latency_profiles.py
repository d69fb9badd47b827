"""What the test bed's network profiles deliver, and what the NFQUEUE delayer costs.

For each profile (tests/testbed/latency.py) on 3 simulated hosts:
  RTT    median of 9 `ping -U` h1 -> h2, and controller -> h2;
  TCP    one iperf3 stream h1 -> h2 (first seconds omitted: slow start);
  CPU    the delayers' CPU time during that transfer, as a share of one core
         (h2's delays the data, h1's the ACKs).
The two-site profiles (places h1, h2 | h3) measure h1 -> h3, between the places, against the
profile's targets, and one more row, `inside`, h1 -> h2 in one place (no target: unshaped).
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

# (seconds, omitted seconds) of each iperf3 run, by the applied profile's name
IPERF = {"lan": (3, 0), "home": (6, 2), "far": (10, 3), "ceiling": (5, 1), "two-site": (6, 2), "two-site-far": (10, 3),
         "three-site": (6, 2)}
RING = [(2, 1), (3, 2), (1, 3)]  # (server, client)
BETWEEN_SITES = (3, 1)  # two-site: h3 is the other place


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


def one(cluster: SimCluster, label: str, profile: Profile, pairs: list[tuple[int, int]] = RING[:1],
        target: Profile | None = None) -> Row:
    """`profile` applied, `pairs` (server, client) measured, against `target` (default: the profile)."""
    latency.apply(cluster.hosts, cluster.paths, profile)
    try:
        server, client = pairs[0]
        peers = measure.ping(cluster, client, cluster.host(server).address)
        controller = measure.ping(None, 0, cluster.host(server).address)
        seconds, omit = IPERF[profile.name]
        cpu0, t0 = _delayer_cpu(cluster), time.monotonic()
        with ThreadPoolExecutor(len(pairs)) as pool:
            transfers = list(pool.map(lambda p: measure.iperf(
                cluster, p[0], p[1], cluster.host(p[0]).address, seconds=seconds, omit=omit), pairs))
        cpu = (_delayer_cpu(cluster) - cpu0) / (time.monotonic() - t0)
    finally:
        latency.clear(cluster.hosts, cluster.paths)
    mbit = sum(t.received_bits_per_second for t in transfers) / len(transfers) / 1e6
    return Row(label, target or profile, peers.median_ms, controller.median_ms, mbit, cpu)


def rows_of(cluster: SimCluster, profile: Profile) -> list[Row]:
    if profile.sites == 1:
        return [one(cluster, profile.name, profile)]
    inside = Profile("inside", rate_mbit=None, rtt_ms=0.0)
    between = [one(cluster, profile.name, profile, [BETWEEN_SITES])]
    if len(latency.places(cluster.hosts, profile.sites)[0]) < 2:  # three-site on 3 hosts: no two share a place
        return between
    return between + [one(cluster, "inside", profile, target=inside)]


def print_table(rows: list[Row]) -> None:
    lan = rows[0].mbit
    print(f"{'profile':>12}  {'RTT ms':>7} {'target':>6} {'ratio':>5}  {'ctl RTT':>7}  "
          f"{'Mbit/s':>7} {'target':>6} {'ratio':>5}  {'÷ lan':>6}  {'delayer CPU':>11}")
    for r in rows:
        target_rtt = r.profile.rtt_ms
        rtt_ratio = f"{r.rtt_ms / target_rtt:5.2f}" if target_rtt else "    -"
        rate = r.profile.rate_mbit
        rate_txt = f"{rate:>6}" if rate else "     -"
        rate_ratio = f"{r.mbit / rate:5.2f}" if rate else "    -"
        print(f"{r.label:>12}  {r.rtt_ms:7.2f} {target_rtt:6.0f} {rtt_ratio}  {r.controller_rtt_ms:7.2f}  "
              f"{r.mbit:7.1f} {rate_txt} {rate_ratio}  {r.mbit / lan:6.4f}  {r.cpu_share:10.1%}")


def main() -> int:
    cluster = SimCluster("/tmp/meshrun-testbed")
    with exclusive():
        cluster.up(3)
        try:
            rows = [row for p in latency.PROFILES for row in rows_of(cluster, p)]
            rows.append(one(cluster, "far x3", latency.lookup("far"), RING))
            rows.append(one(cluster, "ceiling", Profile("ceiling", rate_mbit=None, rtt_ms=20.0)))
        finally:
            cluster.down()
    print_table(rows)
    print("Mbit/s: TCP payload received per stream (tbf counts Ethernet frames: payload "
          "<= 95.6 % of the rate); delayer CPU: all three delayers, share of one core.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
