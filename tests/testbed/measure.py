"""Measuring the simulated network: round-trip times (ping -U), TCP throughput
(iperf3) and a process's CPU time. Used by tests/test_profiles.py and
bench/latency_profiles.py.

* `ping -U` (user-to-user latency): plain ping timestamps a reply when it
  arrives, before INPUT, so it misses the delay the delayer adds on the way back
  into the sender (NOTES.md §5).
  With -U the figure also holds ping's own wait for a core after each reply: on a
  loaded machine (the suite beside it) that wait reached tens of ms (a 60.2 ms median
  on `home`'s 40, 2026-12-07). ping is the instrument, not the workload: it runs at
  the simulated network's priority (NETWORK_NICE), as the delayer does.
* iperf3 with ``--omit``: the first seconds (TCP slow start; at 150 ms RTT it
  needs ~1 s to fill a 50 Mbit/s path) are left out of the figure.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .proc import NETWORK_NICE, run

_TIME_RE = re.compile(r" time=([0-9.]+) ms")


class Runs(Protocol):
    """What SimCluster offers to run a command inside host i."""

    def exec(self, i: int, argv: Sequence[str], *, check: bool = ..., timeout: float | None = ...,
             input: str | None = ...) -> subprocess.CompletedProcess[str]: ...

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]: ...


@dataclass(frozen=True)
class Pings:
    sent: int
    rtts_ms: tuple[float, ...]  # one per reply, in order

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rtts_ms)

    @property
    def min_ms(self) -> float:
        """The floor: a loaded machine only adds to the delay the profile sets (the delay queue is
        a user-space process)."""
        return min(self.rtts_ms)

    @property
    def lost(self) -> int:
        return self.sent - len(self.rtts_ms)


def ping_argv(address: str, count: int, interval: float) -> list[str]:
    return ["ping", "-U", "-n", "-c", str(count), "-i", f"{interval:g}", "-W", "3", address]


def parse_pings(sent: int, stdout: str) -> Pings:
    return Pings(sent, tuple(float(m.group(1)) for m in _TIME_RE.finditer(stdout)))


def ping(cluster: Runs | None, i: int, address: str, *, count: int = 9,
         interval: float = 0.2) -> Pings:
    """ping -U from host i (or from the controller, this namespace, if cluster is None)."""
    argv = ["nice", "-n", str(NETWORK_NICE), *ping_argv(address, count, interval)]
    timeout = count * interval + 30
    # ping exits 1 when replies are missing: the count says how many.
    result = (run(argv, check=False, timeout=timeout) if cluster is None
              else cluster.exec(i, argv, check=False, timeout=timeout))
    return parse_pings(count, result.stdout)


@dataclass(frozen=True)
class Transfer:
    received_bits_per_second: float
    retransmits: int


def iperf(cluster: Runs, server: int, client: int, address: str, *, seconds: int,
          omit: int = 0) -> Transfer:
    """One TCP stream client -> server (iperf3 -s -1 inside host `server`)."""
    srv = cluster.popen(server, ["iperf3", "-s", "-1", "-B", address],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        report = _iperf_client(cluster, client, address, seconds, omit)
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait(10)
    end = report["end"]
    return Transfer(float(end["sum_received"]["bits_per_second"]),
                    int(end["sum_sent"].get("retransmits", 0)))


def _iperf_client(cluster: Runs, client: int, address: str, seconds: int,
                  omit: int) -> dict[str, Any]:
    """Retried while the server is still starting (iperf3 3.12 with -J may exit
    0 on "Connection refused": its JSON then has "error")."""
    argv = ["iperf3", "-c", address, "-t", str(seconds), "-O", str(omit), "-J"]
    deadline = time.monotonic() + 20
    while True:
        result = cluster.exec(client, argv, check=False, timeout=seconds + omit + 60)
        try:
            report: dict[str, Any] = json.loads(result.stdout)
        except json.JSONDecodeError:
            report = {"error": f"rc={result.returncode} {result.stderr.strip()}"}
        if "error" not in report:
            return report
        if time.monotonic() > deadline:
            raise RuntimeError(f"iperf3 from host {client} to {address} failed: {report['error']}")
        time.sleep(0.3)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
