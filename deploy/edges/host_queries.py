"""Facts read from hosts with small commands: argv builders and parsers of their JSON output.

Parsers are pure and tested on recorded output; `route_interface` is the one effectful helper.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges.transport import Session


@dataclass(frozen=True)
class Interface:
    name: str
    mtu: int | None


def route_get_argv(address: str) -> list[str]:
    return ["ip", "-j", "route", "get", address]


def link_show_argv(name: str) -> list[str]:
    return ["ip", "-j", "link", "show", "dev", name]


def parse_route_dev(output: str) -> str | None:
    """The `dev` of `ip -j route get` output, or None."""
    try:
        routes = json.loads(output)
    except ValueError:
        return None
    return routes[0].get("dev") if routes else None


def parse_link_mtu(output: str) -> int | None:
    try:
        links = json.loads(output)
    except ValueError:
        return None
    return int(links[0]["mtu"]) if links and "mtu" in links[0] else None


def route_interface(session: Session, address: str) -> Interface:
    """The interface `session.host` uses to reach `address`, with its MTU."""
    result = session.run(route_get_argv(address), timeout=10)
    name = parse_route_dev(result.stdout) if result.ok else None
    if name is None:
        raise MeshrunError(f"host '{session.host.name}': no route to {address} "
                           f"({result.stderr.strip() or 'ip route get gave nothing'}); check the host's network and its route to the peer")
    link = session.run(link_show_argv(name), timeout=10)
    return Interface(name, parse_link_mtu(link.stdout) if link.ok else None)


def peer_address_for(host_name: str, rdzv_name: str, addresses: dict[str, str]) -> str | None:
    """Whom a host routes to for its training interface: the rendezvous host, or, on the
    rendezvous host itself, the first other host (a route to its own address says `lo`)."""
    if host_name != rdzv_name:
        return addresses[rdzv_name]
    others = [a for name, a in addresses.items() if name != host_name]
    return others[0] if others else None


NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.used,memory.total", "--format=csv,noheader,nounits")


def parse_gpus(output: str) -> tuple[tuple[int, str, int, int], ...]:
    """`nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader,nounits`
    → (index, name, MiB used, MiB total) per GPU; lines that do not parse are skipped."""
    gpus = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not (parts[0].isdigit() and parts[2].isdigit() and parts[3].isdigit()):
            continue
        gpus.append((int(parts[0]), parts[1], int(parts[2]), int(parts[3])))
    return tuple(gpus)


def parse_json_object(output: str) -> dict | None:
    """The last line of `output` that is a JSON object (a probe's answer after any warnings)."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
