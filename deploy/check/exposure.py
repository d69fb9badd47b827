"""The exposure check's verdicts (issue 12, hole 6), pure.

torch's store listens on every address whatever `--local-addr` says, an elastic run adds a second
store on a random port, and gloo listens on ephemeral ports. On an overlay (zerotier, wireguard)
only the overlay should reach them. From the controller, which is not on the overlay's private
path, the check connects to each host's other address (`ssh_address`) on the rendezvous port and
on an ephemeral port where a bait listens on every address: any answer FAILs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from meshrun.deploy.check.findings import Finding, fail, worst
from meshrun.deploy.check.verdicts import CheckReport
from meshrun.deploy.inventory.model import Host, Network

OVERLAYS = (Network.ZEROTIER, Network.WIREGUARD)
FIX = "close it: fab firewall up (docs/security.md#the-network-is-the-boundary-exposure-check-and-fab-firewall)"


@dataclass(frozen=True)
class ExposureTarget:
    host: str
    address: str  # an address of the host off the overlay
    port: int
    what: str  # which listener the port stands for, for the message


@dataclass(frozen=True)
class ExposureResult:
    target: ExposureTarget
    state: str  # "open", "refused", "timeout", "unreachable", "error"


def exposed_addresses(host: Host) -> tuple[str, ...]:
    """The host's addresses off the overlay that the controller knows: its `ssh_address`."""
    if host.network not in OVERLAYS or host.is_local or not host.ssh_address or host.ssh_address == host.address:
        return ()
    return (host.ssh_address,)


def exposure_targets(host: Host, ephemeral: int, rendezvous: int | None) -> tuple[ExposureTarget, ...]:
    ports = ([(rendezvous, "the rendezvous store's port")] if rendezvous is not None else []) + [
        (ephemeral, "an ephemeral port (gloo, an elastic run's extra store)")]
    return tuple(ExposureTarget(host.name, address, port, what)
                 for address in exposed_addresses(host) for port, what in ports)


def exposure_findings(results: tuple[ExposureResult, ...]) -> list[Finding]:
    return [fail(r.target.host, f"{r.target.address}:{r.target.port} ({r.target.what}) answers off the overlay: "
                                "torch's store and gloo are unauthenticated, whoever reaches them can join or "
                                f"poison the job; {FIX}")
            for r in results if r.state == "open"]


def with_findings(report: CheckReport, extra: list[Finding]) -> CheckReport:
    findings = (*report.findings, *extra)
    return dataclasses.replace(report, findings=findings, level=worst(f.level for f in findings))
