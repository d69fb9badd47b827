"""Steps several tasks share: open sessions to hosts, find their training interfaces."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Mapping

from deploy.errors import MeshrunError
from deploy.fanout import failures, on_each, require_all
from deploy.inventory import Host, Inventory
from deploy.probes import peer_address_for, route_interface
from deploy.transport import CommandResult, Session, connect


def reachable_results(sessions: Mapping[str, Session], names: Iterable[str], argv: list[str],
                      timeout: float) -> Iterator[tuple[str, CommandResult]]:
    """(host, result) of `argv` on each named host that still answers; after a run, some may not."""
    for name in names:
        try:
            yield name, sessions[name].run(argv, timeout=timeout)
        except MeshrunError:
            continue


def connect_all(hosts: tuple[Host, ...], inventory: Inventory, root: Path) -> dict[str, Session]:
    """An open session per host, or one error naming every host that failed."""
    results = on_each(hosts, lambda h: connect(h, inventory.known_hosts, root), timeout=30)
    failed = failures(results)
    if failed:
        for session in results.values():
            if not isinstance(session, MeshrunError):
                session.close()
        raise MeshrunError("; ".join(str(e) for e in failed.values()))
    return results  # type: ignore[return-value]


def training_interfaces(hosts: tuple[Host, ...], head: Host, sessions: Mapping[str, Session]) -> dict[str, str]:
    """Per host, the interface that routes to the rendezvous host (for NCCL/GLOO_SOCKET_IFNAME)."""
    if len(hosts) == 1 and hosts[0].is_local:
        return {}
    addresses = {h.name: h.address for h in hosts}

    def probe(host: Host) -> str:
        peer = peer_address_for(host.name, head.name, addresses)
        return route_interface(sessions[host.name], peer).name if peer else ""

    results = require_all(on_each(hosts, probe, timeout=30))
    return {name: iface for name, iface in results.items() if iface}
