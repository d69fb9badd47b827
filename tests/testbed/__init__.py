"""Simulated multi-host cluster for meshrun's tests.

Each host h<i> is a network namespace mrt<i> on the bridge mrtbr0
(10.77.0.(10+i)/24) running a real sshd with its own hostname (UTS namespace),
/etc/hosts and private home directory; optionally a wireguard-go overlay
(10.78.0.(10+i)/24, wg0) and the real ZeroTier One daemon (10.79.0.(10+i)/24,
ztmrt0; `SimCluster.zerotier`, zerotier.py). Network profiles (rate, RTT,
loss: lan, home 20 Mbit/s 40 ms, far 50 Mbit/s 150 ms) with
`with cluster.profile("far"):` (latency.py, its NFQUEUE delayer delayer.c).
Needs root. Try it by hand: `python -m tests.testbed`.

Those names and subnets are slot 0's. A machine holds two more clusters beside it on slots 1 and 2
(mru<i>, mrubr0, 10.74.0.x, overlay 10.75.0.x; mrv<i>, 10.71.0.x, 10.72.0.x; each its own state dir
and lock), chosen by MESHRUN_TESTBED_SLOT or the pytest-xdist worker (layout.py): the test runner's
second and third workers run their share of the cluster tests there.
"""

from .cluster import ClusterState, DownReport, Process, SimCluster
from .layout import Host
from .requirements import APT_PACKAGES, missing_requirements

__all__ = [
    "APT_PACKAGES", "ClusterState", "DownReport", "Host", "Process", "SimCluster",
    "missing_requirements",
]
