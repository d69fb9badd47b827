"""Facts read from hosts with small commands: argv builders and parsers of their JSON output.

Parsers are pure and tested on recorded output; `route_interface`, `route_dev` and `timed_run` are the
effectful helpers.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.run.answers import from_json, said
from meshrun.deploy.edges.transport import CommandResult, Session


@dataclass(frozen=True)
class Interface:
    name: str
    mtu: int | None


def route_get_argv(address: str) -> list[str]:
    return ["ip", "-j", "route", "get", address]


def link_show_argv(name: str) -> list[str]:
    return ["ip", "-j", "link", "show", "dev", name]


def interface_name(value: object) -> str | None:
    """A Linux interface name as the kernel allows it (at most 15 characters, no space or slash), or
    None: it goes into NCCL_SOCKET_IFNAME and into `ip link show dev NAME` on the host."""
    if not (isinstance(value, str) and 0 < len(value) <= 15 and value.isprintable()):
        return None
    return None if any(c.isspace() or c == "/" for c in value) or value in (".", "..") else value


def parse_route_dev(output: str) -> str | None:
    """The `dev` of `ip -j route get` output, or None (none, or an answer of another shape)."""
    routes = from_json(output)
    if not (isinstance(routes, list) and routes and isinstance(routes[0], dict)):
        return None
    return interface_name(routes[0].get("dev"))


MTU_RANGE = (68, 65536)  # IPv4's minimum to the largest an interface reports (loopback)


def parse_link_mtu(output: str) -> int | None:
    links = from_json(output)
    if not (isinstance(links, list) and links and isinstance(links[0], dict)):
        return None
    mtu = links[0].get("mtu")
    ok = isinstance(mtu, int) and not isinstance(mtu, bool) and MTU_RANGE[0] <= mtu <= MTU_RANGE[1]
    return mtu if ok else None


def route_interface(session: Session, address: str) -> Interface:
    """The interface `session.host` uses to reach `address`, with its MTU."""
    name = route_dev(session, address)
    link = session.run(link_show_argv(name), timeout=10)
    return Interface(name, parse_link_mtu(link.stdout) if link.ok else None)


def route_dev(session: Session, address: str) -> str:
    """The name of the interface `session.host` uses to reach `address`: all a launch needs (one
    command; over a 150 ms link each costs about half a second). create_workdir: at launch this runs
    beside the code sync, which is what makes a fresh host's workdir (and every command starts there)."""
    result = session.run(route_get_argv(address), timeout=10, create_workdir=True)
    name = parse_route_dev(result.stdout) if result.ok else None
    if name is None:
        last = said((result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1], 200)
        tool = None if result.ok else ip_trouble(result.rc, result.stderr)
        if tool is not None:
            raise MeshrunError(f"host '{session.host.name}': {tool} ({last}); meshrun finds the training interface "
                               f"with `ip -j route get`: install iproute2 >= 4.13 there (apt-get install iproute2)")
        why = f"ip route get gave no interface: {shown(result.stdout.strip(), 120)}" if result.ok else last
        raise MeshrunError(f"host '{session.host.name}': no route to {address} ({why}); "
                           "check the host's network and its route to the peer")
    return name


# An iproute2 before 4.13 says `Option "-j" is unknown, try "ip -help".`; busybox's applet, `invalid option`.
UNKNOWN_OPTION_RE = re.compile(r"option\b.{0,20}\b(unknown|invalid|unrecognized)|(unknown|invalid|unrecognized) option",
                               re.IGNORECASE)
# Only the words that name `ip`: a login script's own "command not found" says nothing about it.
NOT_FOUND_RE = re.compile(r"\bip: (command )?not found|not found: ip\b|\bip: no such file", re.IGNORECASE)


def ip_trouble(rc: int, stderr: str) -> str | None:
    """What is wrong with the host's `ip` itself when `ip -j route get` failed, or None (a real
    failure to route): before the network is blamed, a missing tool or one too old for `-j`.
    rc 127: the shell (or, for a local host, the controller) found no `ip` to run."""
    if rc == 127 or NOT_FOUND_RE.search(stderr):
        return "`ip` (iproute2) was not found on its PATH"
    if UNKNOWN_OPTION_RE.search(stderr):
        return "its `ip` has no JSON output (`-j`, iproute2 >= 4.13)"
    return None


def peer_address_for(host_name: str, rdzv_name: str, addresses: dict[str, str]) -> str | None:
    """Whom a host routes to for its training interface: the rendezvous host, or, on the
    rendezvous host itself, the first other host (a route to its own address says `lo`)."""
    if host_name != rdzv_name:
        return addresses[rdzv_name]
    others = [a for name, a in addresses.items() if name != host_name]
    return others[0] if others else None


COUNT_RE = re.compile(r"[0-9]{1,9}")  # a GPU index or MiB
GPU_UUID_RE = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,80}")  # nvidia-smi's `GPU-8d2c…`; anything else: null
GPU_NAME_CLIP = 80
NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.used,memory.total,uuid", "--format=csv,noheader,nounits")


def parse_gpus(output: str) -> tuple[tuple[int, str, int, int, str | None], ...]:
    """`nvidia-smi --query-gpu=index,name,memory.used,memory.total,uuid --format=csv,noheader,nounits`
    → (index, name, MiB used, MiB total, UUID or None) per GPU; lines that do not parse are skipped."""
    gpus = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not all(COUNT_RE.fullmatch(parts[i]) for i in (0, 2, 3)):
            continue  # `²`.isdigit() is true, but int() refuses it: ASCII digits only
        uuid = parts[4] if GPU_UUID_RE.fullmatch(parts[4]) else None
        gpus.append((int(parts[0]), parts[1][:GPU_NAME_CLIP], int(parts[2]), int(parts[3]), uuid))
    return tuple(gpus)


def parse_json_object(output: str) -> dict | None:
    """The last line of `output` that is a JSON object (a probe's answer after any warnings)."""
    for line in reversed(output.strip().splitlines()):
        value = from_json(line)
        if isinstance(value, dict):
            return value
    return None


class Timed(NamedTuple):
    """A command's result and this machine's wall clock as it was asked for and as its answer was in:
    the window in which the host read its clock for the facts probe (deploy/check/clocks.reading)."""

    result: CommandResult
    sent_at: float
    answered_at: float


def timed_run(session: Session, argv: Sequence[str], timeout: float) -> Timed:
    """`session.run(argv)` between two readings of this machine's clock, in the same round trip. The
    end is the start plus the monotonic time between: a step of this machine's clock while the host
    answers (NTP, a resume) moves both ends together, never the window's width."""
    sent_at, started = time.time(), time.monotonic()
    result = session.run(argv, timeout=timeout)
    return Timed(result, sent_at, sent_at + (time.monotonic() - started))
