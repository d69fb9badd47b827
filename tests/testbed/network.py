"""Namespaces, the bridge, veths, hosts files, shaping and link faults.

Layout: one bridge ``mrtbr0`` (10.77.0.1/24) in the root namespace is the LAN
switch; each host is a network namespace ``mrt<i>`` with a veth whose root end
``mrt<i>h`` is a bridge port and whose inner end is ``eth0`` (10.77.0.(10+i)).
Namespaces get no default route: nothing can leave the simulated subnets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from .layout import BRIDGE, GATEWAY, NETNS_RE, NS_IFNAME, VETH_RE, Host, StatePaths
from .proc import run


def own_netns() -> list[str]:
    """Our namespaces (``mrt<digits>``) that exist now, whoever made them."""
    out = run(["ip", "-j", "netns", "list"]).stdout.strip()
    names = [entry["name"] for entry in json.loads(out)] if out else []
    return sorted((n for n in names if NETNS_RE.match(n)), key=lambda n: int(n[3:]))


def own_root_links() -> list[str]:
    """Our links in the root namespace: the bridge and ``mrt<i>h`` veths."""
    out = run(["ip", "-j", "link", "show"]).stdout.strip()
    names = [entry["ifname"] for entry in json.loads(out)] if out else []
    return [n for n in names if n == BRIDGE or VETH_RE.match(n)]


def create_bridge() -> None:
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def create_host_link(host: Host) -> None:
    run(["ip", "netns", "add", host.netns])
    # Create the peer directly inside the namespace: no window where a stray
    # "eth0" exists in the root namespace.
    run(["ip", "link", "add", host.veth, "type", "veth",
         "peer", "name", NS_IFNAME, "netns", host.netns])
    run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
    run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", NS_IFNAME])
    run(["ip", "-n", host.netns, "link", "set", NS_IFNAME, "up"])


def hosts_file_text(all_hosts: list[Host]) -> str:
    """/etc/hosts for every host: each name (and its ``-wg`` overlay name) maps
    to its address. Without this the hostname would not resolve inside a
    namespace, and torchrun's c10d rendezvous dies with socket.gaierror."""
    lines = ["127.0.0.1 localhost", f"{GATEWAY} {BRIDGE}-gw"]
    for h in all_hosts:
        lines.append(f"{h.address} {h.name}")
        lines.append(f"{h.overlay_address} {h.overlay_name}")
    return "\n".join(lines) + "\n"


def write_hosts_file(host: Host, paths: StatePaths, text: str) -> None:
    target = paths.netns_hosts_file(host)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def delete_netns(netns: str) -> None:
    run(["ip", "netns", "del", netns], check=False)
    netns_etc = Path("/etc/netns") / netns
    if NETNS_RE.match(netns) and netns_etc.is_dir():
        shutil.rmtree(netns_etc)


def delete_root_links() -> None:
    for link in own_root_links():
        run(["ip", "link", "del", link], check=False)
    # /etc/netns itself may be used by others: remove only if we emptied it.
    try:
        Path("/etc/netns").rmdir()
    except OSError:
        pass


NEIGH_SYSCTLS = tuple(f"/proc/sys/net/{family}/neigh/default/gc_thresh{level}"
                      for family in ("ipv4", "ipv6") for level in (2, 3))


def neighbour_room(n: int) -> dict[str, int]:
    """The neighbour-table thresholds N hosts need. The kernel keeps ONE ARP (and one ND) table for
    the whole machine, every namespace's entries in it: each host holds one per peer and the
    gateway on the LAN, and again on an overlay, so 32 hosts need over 2000 where the default
    hard limit (gc_thresh3) is 1024. Past it new entries fail ("neighbor table overflow") and the
    last pairs to talk lose their packets, which check-network rightly reports as timeouts.
    Real machines each have their own table: only the test bed needs this."""
    entries = 2 * (n + 1) * (n + 1)
    return {path: entries * (2 if path.endswith("3") else 1) for path in NEIGH_SYSCTLS}


def raise_neighbour_room(n: int, saved: Path) -> None:
    """Raise the thresholds where they are too low; the first values are kept in `saved` so that
    restore_neighbour_room() puts the machine back as it was."""
    originals = json.loads(saved.read_text()) if saved.exists() else {}
    for path, wanted in neighbour_room(n).items():
        if not Path(path).exists():  # IPv6 off
            continue
        current = int(Path(path).read_text())
        if current < wanted:
            originals.setdefault(path, current)
            saved.write_text(json.dumps(originals))
            Path(path).write_text(str(wanted))


def restore_neighbour_room(saved: Path) -> None:
    if not saved.exists():
        return
    for path, value in json.loads(saved.read_text()).items():
        if path in NEIGH_SYSCTLS:
            Path(path).write_text(str(int(value)))
    saved.unlink()


def _tbf(rate: str) -> list[str]:
    # Only tbf/htb/fifo qdiscs exist on the lab kernel (no netem, fq, cake).
    return ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"]


def shape(host: Host, rate: str) -> None:
    """Limit both directions of the host's link: egress of each veth end."""
    run(["tc", "qdisc", "replace", "dev", host.veth, *_tbf(rate)])
    run(["ip", "netns", "exec", host.netns,
         "tc", "qdisc", "replace", "dev", NS_IFNAME, *_tbf(rate)])


def between_argv(host: Host, others: list[str], rate: str, near: Sequence[str] = (),
                 near_rate: str | None = None) -> list[list[str]]:
    """htb on both ends of the host's veth: traffic to (inside, egress of eth0) or from (the root
    end, egress towards the host) the `others` addresses at `rate`, to or from the `near` ones at
    `near_rate` (a slower LAN inside the host's place), everything else unshaped.
    No default class: unclassified packets take htb's direct queue. A 10gbit default class
    halved the LAN inside a place (7 Gbit/s against 15 on lan, one iperf3 stream) and cost every
    packet htb's accounting, which `hier`'s every-step all-reduce inside a site pays."""
    classes = [(others, rate)] + ([(list(near), near_rate)] if near and near_rate else [])
    out = []
    for prefix, dev, side in (([], host.veth, "src"), (["ip", "netns", "exec", host.netns], NS_IFNAME, "dst")):
        out.append([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb"])
        for n, (addresses, class_rate) in enumerate(classes):
            classid = f"1:{20 + n}"
            out.append([*prefix, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb",
                        "rate", class_rate, "burst", "64kb", "quantum", "60000"])
            out += [[*prefix, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", side, f"{address}/32", "flowid", classid] for address in addresses]
    return out


def shape_between(host: Host, others: list[str], rate: str, near: Sequence[str] = (),
                  near_rate: str | None = None) -> None:
    for argv in between_argv(host, others, rate, near, near_rate):
        run(argv)


def unshape(host: Host) -> None:
    run(["tc", "qdisc", "del", "dev", host.veth, "root"], check=False)
    run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", NS_IFNAME, "root"],
        check=False)


def set_link(host: Host, up: bool) -> None:
    """cut (down) / heal (up) both ends of the host's LAN link. The overlay runs
    over it, so a cut host is unreachable on both networks."""
    state = "up" if up else "down"
    run(["ip", "link", "set", host.veth, state])
    run(["ip", "-n", host.netns, "link", "set", NS_IFNAME, state])
