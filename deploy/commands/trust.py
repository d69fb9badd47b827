"""`fab trust`: fetch each host's SSH key, show its fingerprint, and, once the user agrees,
append it to the inventory's known_hosts. A changed key is always an error, never replaced."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable

import paramiko

from deploy.edges import hostkeys
from deploy.errors import MeshrunError
from deploy.edges.fanout import on_each
from deploy.inventory.load import inventory_path, load_inventory
from deploy.inventory.model import Host
from deploy.render.console import Renderer
from deploy.render.check import print_host_keys
from deploy.inventory.selection import select_hosts
from deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, scan_host_key

USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


class KeyStatus(str, Enum):
    NEW = "new"
    KNOWN = "already trusted"
    CHANGED = "CHANGED"


@dataclass(frozen=True)
class KeyOffer:
    host: str
    name: str  # the known_hosts name: `addr` or `[addr]:port`
    key: paramiko.PKey
    status: KeyStatus
    known: paramiko.PKey | None = None  # the recorded key, when CHANGED


@dataclass(frozen=True)
class TrustRequest:
    inventory: str | None
    hosts: str | None
    yes: bool = False
    timeout: float = DEFAULT_CONNECT_TIMEOUT_S


def classify(host: Host, key: paramiko.PKey, known: dict[str, paramiko.PKey]) -> KeyOffer:
    name = hostkeys.known_hosts_name(host.ssh_host, host.port)
    recorded = known.get(key.get_name())
    if recorded is None:
        return KeyOffer(host.name, name, key, KeyStatus.NEW)
    if recorded.asbytes() == key.asbytes():
        return KeyOffer(host.name, name, key, KeyStatus.KNOWN)
    return KeyOffer(host.name, name, key, KeyStatus.CHANGED, recorded)


def offer_for(host: Host, known_hosts: Path | None, timeout: float) -> KeyOffer:
    known = hostkeys.known_keys(known_hosts, hostkeys.known_hosts_name(host.ssh_host, host.port))
    return classify(host, scan_host_key(host, timeout, preferred=list(known)), known)


def changed_error(offer: KeyOffer, path: Path) -> MeshrunError:
    assert offer.known is not None
    return hostkeys.changed_key_error(offer.host, paramiko.BadHostKeyException(offer.name, offer.key, offer.known), path)


def trust(request: TrustRequest, renderer: Renderer, interactive: bool, confirm: Callable[[str], bool]) -> int:
    inventory = load_inventory(inventory_path(request.inventory))
    hosts = tuple(h for h in select_hosts(inventory, request.hosts).hosts if not h.is_local)
    path = inventory.known_hosts or USER_KNOWN_HOSTS.expanduser()
    results = on_each(hosts, lambda h: offer_for(h, inventory.known_hosts, request.timeout), timeout=request.timeout + 5)
    offers = [r for r in results.values() if isinstance(r, KeyOffer)]
    print_host_keys(renderer, [(o.host, o.name, f"{hostkeys.fingerprint(o.key)} ({o.key.get_name()})",
                                o.status.value) for o in offers], str(path))
    problems = [changed_error(o, path) for o in offers if o.status is KeyStatus.CHANGED]
    problems += results.failed.values()
    new = [o for o in offers if o.status is KeyStatus.NEW]
    if new and not request.yes:
        names = ", ".join(o.host for o in new)
        if not interactive:
            raise MeshrunError(f"fab trust: {len(new)} new host key(s) ({names}) and no terminal to ask on; compare the "
                               "fingerprints above with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on each "
                               "host, then rerun with --yes")
        if not confirm(f"Trust the new key(s) of {names} and add them to {path}?"):
            raise MeshrunError(f"fab trust: nothing written; the key(s) of {names} stay untrusted")
    for offer in new:
        hostkeys.append_known_host(path, offer.name, offer.key)
        renderer.info(f"trusted {offer.host}: {offer.name} {hostkeys.fingerprint(offer.key)} added to {path}")
    if problems:
        raise MeshrunError("; ".join(str(p) for p in problems))
    if not new:
        renderer.info("nothing to do: every selected host's key is already trusted")
    return 0


def _ask(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def main(request: TrustRequest) -> int:
    """`fab trust`: asks before adding keys when run at a terminal."""
    return trust(request, Renderer(), sys.stdin.isatty(), _ask)
