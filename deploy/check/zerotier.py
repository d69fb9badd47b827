"""ZeroTier state, pure: `zerotier-cli -j info|listnetworks|peers` JSON → records → findings.

The JSON is the service's own API output (ZeroTierOne `one.cpp` prints it unchanged with `-j`):
`info` has `address`, `online`, `tcpFallbackActive`, `version`; `listnetworks` one object per
network with `nwid`, `name`, `status`, `portDeviceName`, `mtu`, `assignedAddresses` (CIDR);
`peers` one object per peer with `address`, `role` (LEAF, PLANET, MOON), `latency` and `paths`.
A peer is DIRECT when it has a preferred, unexpired path, else its traffic is RELAYed through
a root, as `zerotier-cli peers` shows it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from meshrun.deploy.check.findings import Finding, fail, warn
from meshrun.deploy.run.answers import MISSING, from_json, is_int

CLI = "zerotier-cli"
SUBCOMMANDS = ("info", "listnetworks", "peers")
ENTRY = {"listnetworks": "a network", "peers": "a peer"}  # what one list entry is, in messages
FIX_OFFLINE = "start it (`systemctl start zerotier-one`) and let UDP 9993 out; see docs/zerotier.md"


class NodeState(str, Enum):
    ONLINE = "ONLINE"
    OFFLINE = "OFFLINE"
    TUNNELED = "TUNNELED"  # reaches the roots only over the TCP fallback relay: slow


class Link(str, Enum):
    DIRECT = "DIRECT"
    RELAY = "RELAY"


@dataclass(frozen=True)
class ZtNetwork:
    nwid: str
    name: str
    status: str  # OK, ACCESS_DENIED, REQUESTING_CONFIGURATION, NOT_FOUND, PORT_ERROR, ...
    device: str | None  # portDeviceName, e.g. ztabcdef12
    mtu: int | None
    addresses: tuple[str, ...]  # assignedAddresses without the prefix length


@dataclass(frozen=True)
class ZtPeer:
    node: str
    role: str
    link: Link
    latency_ms: int | None  # ZeroTier's own `latency` field: NOT a round trip (2-66 ms seen where ICMP took 0.2)


@dataclass(frozen=True)
class ZeroTierState:
    """What one host's zerotier-cli said; `error` when it could not be asked."""

    node: str | None = None
    state: NodeState | None = None
    version: str | None = None
    networks: tuple[ZtNetwork, ...] = ()
    peers: tuple[ZtPeer, ...] = ()
    error: str | None = None


def argv(cli: str, subcommand: str) -> list[str]:
    return [cli, "-j", subcommand]


def cli_failure(cli: str, subcommand: str, output: str) -> str:
    """Why `zerotier-cli -j SUBCOMMAND` failed, and the fix, from what it printed (host output:
    shown escaped and cut). zerotier-cli says "Error connecting to the ZeroTier service" when no
    daemon listens on its local port; an auth token it cannot read reads differently."""
    said = " ".join(output.split())[:200]
    said = said if said.isprintable() else ascii(said)[1:-1]
    if "connecting to the ZeroTier service" in output or "connection failed" in output:
        return (f"the ZeroTier service is not running (`{cli} -j {subcommand}`: {said}); start it: "
                "`systemctl start zerotier-one` (or `zerotier-one -d`)")
    return (f"`{cli} -j {subcommand}` failed ({said}); it needs root or a copy of authtoken.secret in "
            "~/.zeroTierOneAuthToken")


def _load(text: str, what: str) -> Any:
    value = from_json(text)
    if value is MISSING:
        raise ValueError(f"`zerotier-cli -j {what}` printed no JSON: {text.strip()[:120]!r}")
    return value


def parse_info(text: str) -> tuple[str | None, NodeState, str | None]:
    """(node id, ONLINE/OFFLINE/TUNNELED, version) from `-j info`."""
    info = _load(text, "info")
    if not isinstance(info, dict):
        raise ValueError("`zerotier-cli -j info` is not a JSON object")
    node, version = info.get("address"), info.get("version")
    if not isinstance(node, (str, type(None))) or not isinstance(version, (str, type(None))):
        raise ValueError("`zerotier-cli -j info` gives an address or version that is not text")
    if not all(isinstance(info.get(k), (bool, type(None))) for k in ("online", "tcpFallbackActive")):
        raise ValueError("`zerotier-cli -j info` gives an online or tcpFallbackActive that is not true or false")
    if info.get("tcpFallbackActive"):
        state = NodeState.TUNNELED
    else:
        state = NodeState.ONLINE if info.get("online") else NodeState.OFFLINE
    return node, state, version


def _text(entry: dict, field: str, what: str) -> str | None:
    """`entry[field]` as text, None when left out or null. Another type is a shape error, not
    str()'d: a list would pass for a name and a number would be iterated as addresses."""
    value = entry.get(field)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"`zerotier-cli -j {what}` gives {ENTRY[what]} whose {field} is not text")


def _network(n: dict) -> ZtNetwork:
    addresses = n.get("assignedAddresses")
    if addresses is not None and not (isinstance(addresses, list) and all(isinstance(a, str) for a in addresses)):
        raise ValueError("`zerotier-cli -j listnetworks` gives a network whose assignedAddresses is not a list of text")
    what = "listnetworks"
    return ZtNetwork(nwid=_text(n, "nwid", what) or _text(n, "id", what) or "?", name=_text(n, "name", what) or "",
                     status=_text(n, "status", what) or "?", device=_text(n, "portDeviceName", what) or None,
                     mtu=n["mtu"] if is_int(n.get("mtu")) else None,
                     addresses=tuple(a.split("/")[0] for a in addresses or ()))


def parse_networks(text: str) -> tuple[ZtNetwork, ...]:
    networks = _load(text, "listnetworks")
    if not isinstance(networks, list):
        raise ValueError("`zerotier-cli -j listnetworks` is not a JSON list")
    return tuple(_network(n) for n in networks if isinstance(n, dict))


def _link(paths: Any) -> Link:
    for path in paths if isinstance(paths, list) else ():
        if isinstance(path, dict) and path.get("preferred") and not path.get("expired"):
            return Link.DIRECT
    return Link.RELAY


def parse_peers(text: str) -> tuple[ZtPeer, ...]:
    peers = _load(text, "peers")
    if not isinstance(peers, list):
        raise ValueError("`zerotier-cli -j peers` is not a JSON list")
    return tuple(
        ZtPeer(node=_text(p, "address", "peers") or "?", role=_text(p, "role", "peers") or "?",
               link=_link(p.get("paths")),
               latency_ms=p["latency"] if isinstance(p.get("latency"), int) and p["latency"] >= 0 else None)
        for p in peers if isinstance(p, dict)
    )


def parse_state(info: str, networks: str, peers: str) -> ZeroTierState:
    """All three outputs → one record; unparsable output becomes `error`, never an exception."""
    try:
        node, state, version = parse_info(info)
        return ZeroTierState(node, state, version, parse_networks(networks), parse_peers(peers))
    except ValueError as err:
        return ZeroTierState(error=str(err))


def network_of(state: ZeroTierState, address: str) -> ZtNetwork | None:
    """The joined network that assigned `address` to this node, if any."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for network in state.networks:
        for assigned in network.addresses:
            try:
                if ipaddress.ip_address(assigned) == wanted:
                    return network
            except ValueError:
                continue
    return None


NETWORK_FIXES: Mapping[str, str] = {
    "ACCESS_DENIED": "authorize node {node} in the network's controller (ZeroTier Central: Members, tick Auth)",
    "REQUESTING_CONFIGURATION": "the controller has not answered yet; wait, or check the host reaches it",
    "NOT_FOUND": "no such network: check the network id and `zerotier-cli join` it again",
    "PORT_ERROR": "the TAP device could not be created: check /dev/net/tun and the service's log",
}


def node_names(claims: Iterable[tuple[str, str | None]], where: str) -> tuple[dict[str, str], list[Finding]]:
    """(node id → host name for the ids exactly one selected host reports; a WARN at `where` per id
    two or more report). A node id is one identity's: a second claim is a cloned disk or VM image
    (identity.secret copied with it) or a host answering falsely. Either way the id names no host in
    relay warnings, which would otherwise send the user to open UDP on the wrong one."""
    holders: dict[str, list[str]] = {}
    for name, node in claims:
        if node:
            holders.setdefault(node, []).append(name)
    twins = [(node, names) for node, names in holders.items() if len(names) > 1]
    return {node: names[0] for node, names in holders.items() if len(names) == 1}, [
        warn(where, f"{', '.join(names[:-1])} and {names[-1]} {'both' if len(names) == 2 else 'all'} report ZeroTier "
                    f"node id {node}: a node id belongs to one ZeroTier identity, so one host runs a copy of "
                    "another's (a cloned disk or VM image) or answers falsely, and relays to that id cannot be "
                    "pinned on one host; on the host that should differ, stop zerotier-one, delete identity.public "
                    "and identity.secret in /var/lib/zerotier-one, start it and authorize its new node id")
        for node, names in twins]


def findings(host: str, address: str, state: ZeroTierState, cluster_nodes: Mapping[str, str],
             interface: str | None) -> list[Finding]:
    """Verdicts for one host. `cluster_nodes`: the other selected hosts' node ids → host names."""
    if state.error is not None:
        return [fail(host, f"ZeroTier state unreadable: {state.error}")]
    if state.state is NodeState.OFFLINE:
        return [fail(host, f"ZeroTier node {state.node} is OFFLINE (no contact with its roots); {FIX_OFFLINE}")]
    found = []
    if state.state is NodeState.TUNNELED:
        found.append(warn(host, f"ZeroTier node {state.node} reaches its roots only over the TCP fallback relay "
                                "(TUNNELED): traffic will be slow; let UDP 9993 through the firewall"))
    network = network_of(state, address)
    if network is None:
        # A network that is not OK yet has no addresses: its status is the real news.
        pending = [_status_finding(host, state, n) for n in state.networks if n.status != "OK"]
        joined = ", ".join(f"{n.nwid} {list(n.addresses)}" for n in state.networks) or "none"
        return found + (pending or [fail(host, f"address {address} is not assigned by any joined ZeroTier network "
                                               f"(joined: {joined}); fix `address` in the inventory or the "
                                               "network's IP assignment")])
    if network.status != "OK":
        found.append(_status_finding(host, state, network))
    if interface is not None and network.device is not None and interface != network.device:
        found.append(warn(host, f"traffic to the rendezvous host leaves via {interface}, not the ZeroTier device "
                                f"{network.device}: check `ip route get` on this host"))
    for peer in state.peers:
        if peer.node in cluster_nodes and peer.link is Link.RELAY:
            found.append(warn(host, f"ZeroTier peer {cluster_nodes[peer.node]} ({peer.node}) is RELAYED, not DIRECT: "
                                    "slow; open UDP 9993 (or the node's ports) between the hosts, see docs/zerotier.md"))
    return found


def _status_finding(host: str, state: ZeroTierState, network: ZtNetwork) -> Finding:
    fix = NETWORK_FIXES.get(network.status, "see `zerotier-cli listnetworks`").format(node=state.node)
    return fail(host, f"ZeroTier network {network.nwid} status {network.status}; {fix}")
