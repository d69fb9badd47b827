"""`fab firewall`'s rules, planned: pure argv lists for the host's own iptables/ip6tables.

torch's TCPStore and gloo are unauthenticated and listen on every interface, so the network is
the boundary. meshrun's chain lets in, on a host: loopback, replies to connections the host made,
new SSH connections, and TCP from the member hosts on the training interface only; every other
TCP connection is refused with a reset (fast failure, not a 2-minute hang). Only TCP is filtered:
the store and gloo are TCP, and the overlay's own UDP (WireGuard, ZeroTier) must pass.

Every step is idempotent: `up` twice leaves the same rules, `down` removes the chain and its jump.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from enum import Enum

from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.run.answers import MISSING, Answer, said

CHAIN = "MESHRUN"
TOOLS = ("iptables", "ip6tables")  # one per address family; nft-backed or legacy, whichever the host has
WAIT = ("-w", "10")  # wait for the xtables lock instead of failing when another tool holds it
OUTPUT_CLIP = 4000  # characters of one command's output: what deploy/host/firewall.py keeps of it


class Action(str, Enum):
    UP = "up"
    DOWN = "down"
    STATUS = "status"


@dataclass(frozen=True)
class Step:
    """One command; `only_if`/`unless`: run it only when that probe command succeeds/fails."""

    argv: tuple[str, ...]
    only_if: tuple[str, ...] | None = None
    unless: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FirewallSpec:
    """What one host's chain allows: SSH on `ssh_ports`, and `members` (IP literals) on `interface`."""

    ssh_ports: tuple[int, ...]  # the port the controller dials and the one sshd took the call on
    interface: str
    members: tuple[str, ...]


def ssh_ports(dialled: int, ssh_connection: str) -> tuple[int, ...]:
    """The port the controller dials, and the port sshd answered on as the host's `SSH_CONNECTION`
    (`client_ip client_port server_ip server_port`) says: behind a provider's port forward
    (40022 → 22) they differ, and only the second is what the host's firewall sees. The host wrote
    that variable: anything but a plain port is ignored (it can only lock out its own SSH)."""
    fields = ssh_connection.split()
    inside = fields[3] if len(fields) == 4 else ""
    if inside.isascii() and inside.isdigit() and 0 < int(inside) < 65536 and int(inside) != dialled:
        return (dialled, int(inside))
    return (dialled,)


def parse_action(text: str) -> Action:
    try:
        return Action(text)
    except ValueError:
        raise InputError(f"fab firewall: unknown action {text[:40]!r}; use up, down or status") from None


def member_addresses(addresses: tuple[str, ...]) -> tuple[str, ...]:
    """The members' IP literals, checked; a name cannot go into a rule (it would be resolved once, by
    whoever answers DNS), so it is refused."""
    for address in addresses:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise InputError(f"fab firewall: host address {address[:80]!r} is not an IP address; "
                             "the firewall allows members by address") from None
    return tuple(dict.fromkeys(addresses))


def _family(tool: str, address: str) -> bool:
    return (ipaddress.ip_address(address).version == 4) == (tool == "iptables")


def _chain_rules(tool: str, spec: FirewallSpec) -> tuple[Step, ...]:
    append = (tool, *WAIT, "-A", CHAIN)
    members = tuple(Step((*append, "-i", spec.interface, "-s", m, "-j", "RETURN"))
                    for m in spec.members if _family(tool, m))
    return (
        Step((*append, "-i", "lo", "-j", "RETURN")),
        Step((*append, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN")),
        *(Step((*append, "-p", "tcp", "--dport", str(port), "-j", "RETURN")) for port in spec.ssh_ports),
        *members,
        Step((*append, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")),
    )


def _exists(tool: str) -> tuple[str, ...]:
    return (tool, *WAIT, "-S", CHAIN)


def _jump(tool: str, op: str) -> tuple[str, ...]:
    return (tool, *WAIT, op, "INPUT", "-j", CHAIN)


def up_steps(spec: FirewallSpec) -> tuple[Step, ...]:
    """Create (or empty) the chain, fill it, and jump to it first thing in INPUT, once."""
    steps: list[Step] = []
    for tool in TOOLS:
        steps += [Step((tool, *WAIT, "-N", CHAIN), unless=_exists(tool)),
                  Step((tool, *WAIT, "-F", CHAIN)),
                  *_chain_rules(tool, spec),
                  Step((*_jump(tool, "-I")[:-2], "1", "-j", CHAIN), unless=_jump(tool, "-C"))]
    return tuple(steps)


def down_steps() -> tuple[Step, ...]:
    """Remove the jump, then the chain; nothing to do where there is none."""
    steps: list[Step] = []
    for tool in TOOLS:
        steps += [Step(_jump(tool, "-D"), only_if=_jump(tool, "-C")),
                  Step((tool, *WAIT, "-F", CHAIN), only_if=_exists(tool)),
                  Step((tool, *WAIT, "-X", CHAIN), only_if=_exists(tool))]
    return tuple(steps)


def status_steps() -> tuple[Step, ...]:
    """The chain's rules and whether INPUT jumps to it (their output is the status)."""
    return tuple(step for tool in TOOLS for step in (Step(_exists(tool), only_if=_exists(tool)),
                                                     Step(_jump(tool, "-C"), only_if=_jump(tool, "-C"))))


def steps_for(action: Action, spec: FirewallSpec | None) -> tuple[Step, ...]:
    if action is Action.UP:
        if spec is None:
            raise ValueError("fab firewall up needs a spec")
        return up_steps(spec)
    return down_steps() if action is Action.DOWN else status_steps()


# nftables, for a host with no iptables command (Debian 12's default): the same policy in meshrun's own
# table `inet meshrun` (both families at once). An `accept` ends only this table's chain, as RETURN ends
# meshrun's iptables chain: the host's own rules still apply after it.

NFT_TABLE = ("inet", "meshrun")
NFT_CHAIN = "input"


def _nft_table(verb: str) -> tuple[str, ...]:
    return ("nft", verb, "table", *NFT_TABLE)


def _nft_rule(*words: str) -> tuple[str, ...]:
    return ("nft", "add", "rule", *NFT_TABLE, NFT_CHAIN, *words)


def nft_up_steps(spec: FirewallSpec) -> tuple[Step, ...]:
    """nft's `up`: the table deleted and re-created (`add` first, so the delete never fails)."""
    # The interface name is quoted for nft's parser; names were checked when read from the host.
    iface = f'"{spec.interface}"'
    members = tuple(Step(_nft_rule("iifname", iface, "ip" if ipaddress.ip_address(m).version == 4 else "ip6",
                                   "saddr", m, "accept")) for m in spec.members)
    return (
        Step(_nft_table("add")), Step(_nft_table("delete")), Step(_nft_table("add")),
        Step(("nft", "add", "chain", *NFT_TABLE, NFT_CHAIN, "{", "type", "filter", "hook", "input", "priority", "0",
              ";", "policy", "accept", ";", "}")),
        Step(_nft_rule("iifname", '"lo"', "accept")),
        Step(_nft_rule("ct", "state", "established,related", "accept")),
        *(Step(_nft_rule("tcp", "dport", str(port), "accept")) for port in spec.ssh_ports),
        *members,
        Step(_nft_rule("meta", "l4proto", "tcp", "reject", "with", "tcp", "reset")),
    )


def nft_down_steps() -> tuple[Step, ...]:
    return (Step(_nft_table("delete"), only_if=_nft_table("list")),)


def nft_status_steps() -> tuple[Step, ...]:
    return (Step(_nft_table("list"), only_if=_nft_table("list")),)


def plans_for(action: Action, spec: FirewallSpec | None) -> dict[str, tuple[Step, ...]]:
    """Both backends' plans; the host runs the one it has: `iptables` (and ip6tables, nft-backed or
    legacy) when the command exists, else `nft`."""
    if action is Action.UP:
        if spec is None:
            raise ValueError("fab firewall up needs a spec")
        nft = nft_up_steps(spec)
    else:
        nft = nft_down_steps() if action is Action.DOWN else nft_status_steps()
    return {"iptables": steps_for(action, spec), "nft": nft}


def host_request(action: Action, spec: FirewallSpec | None) -> str:
    """deploy/host/firewall.py's one argument: the action, both backends' plans, and for `up` each
    backend's `down`, which the host runs when a step fails (or for the backend it does not use)."""
    def listed(plans: dict[str, tuple[Step, ...]]) -> dict[str, list[dict]]:
        return {backend: [{"argv": s.argv, "only_if": s.only_if, "unless": s.unless} for s in steps]
                for backend, steps in plans.items()}
    undo = plans_for(Action.DOWN, None) if action is Action.UP else {}
    return json.dumps({"action": action.value, "plans": listed(plans_for(action, spec)), "undo": listed(undo)})


@dataclass(frozen=True)
class HostAnswer:
    """What one host's firewall script did: the commands it ran (with output) and its notes."""

    ran: tuple[tuple[str, ...], ...]
    output: str
    notes: tuple[str, ...]


def host_answer(host: str, answer: object) -> HostAnswer:
    """deploy/host/firewall.py's `{"results": [{"argv", "stdout", ...}], "error": str|null, "notes": [str]}`;
    its `error` is the host's failure, quoted escaped and clipped."""
    reader = Answer(host, "the firewall script")
    answer = reader.mapping(answer)
    error = reader.text(answer.get("error"), "error", optional=True, limit=None)
    if error:
        raise MeshrunError(f"host '{host}': {said(error)}")
    ran, output = [], []
    for i, result in enumerate(reader.array(answer.get("results", MISSING), "results")):
        result = reader.mapping(result, f"results[{i}]")
        ran.append(reader.texts(result.get("argv", MISSING), f"results[{i}].argv"))
        output.append(reader.text(result.get("stdout", MISSING), f"results[{i}].stdout", limit=OUTPUT_CLIP))
    return HostAnswer(tuple(ran), "".join(output), reader.texts(answer.get("notes", []), "notes"))
