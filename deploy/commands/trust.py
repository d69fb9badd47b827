"""`fab trust`: fetch each host's SSH key, show its fingerprint, and, once the user agrees,
append it to the inventory's known_hosts. A changed key is always an error, never replaced."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable

import paramiko

from meshrun.deploy.edges import hostkeys, sshtarget
from meshrun.deploy.project import Project
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.check import print_host_keys
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, scan_host_key

USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


class KeyStatus(str, Enum):
    NEW = "new"
    KNOWN = "already trusted"
    CHANGED = "CHANGED"


@dataclass(frozen=True)
class KeyOffer:
    host: str  # the inventory host, as `fab trust --hosts` takes it
    name: str  # the known_hosts name: `addr` or `[addr]:port`
    key: paramiko.PKey
    status: KeyStatus
    known: hostkeys.Pin | None = None  # the recorded key and the line it is on, when CHANGED
    jump: str | None = None  # the ProxyJump hop this key is of; None: the host itself
    pins: tuple[hostkeys.Pin, ...] = ()  # every line for `name`: a CHANGED key's advice names the stale ones

    @property
    def shown(self) -> str:
        return self.host if self.jump is None else f"{self.host} (jump host {self.jump})"

    @property
    def shown_status(self) -> str:
        """`CHANGED (~/.ssh/known_hosts:3)`: which file holds the key compared, not the one keys are added to."""
        return self.status.value if self.known is None else f"{self.status.value} ({self.known.file}:{self.known.line})"


@dataclass(frozen=True)
class TrustRequest:
    inventory: str | None
    hosts: str | None
    yes: bool = False
    timeout: float = DEFAULT_CONNECT_TIMEOUT_S


def classify(host: str, name: str, key: paramiko.PKey, pins: tuple[hostkeys.Pin, ...],
             jump: str | None = None) -> KeyOffer:
    """NEW only when nothing is pinned for `name`: a key of a new type on a host with a pinned key
    of another is CHANGED (a downgrade or a man in the middle looks exactly like that). The key
    compared is the first of its type, as a connection compares (~/.ssh/known_hosts before the
    inventory's: hostkeys' docstring says why), so trust and connect never disagree."""
    known = hostkeys.first_pins(pins)
    recorded = known.get(key.get_name())
    if recorded is None and known:
        return KeyOffer(host, name, key, KeyStatus.CHANGED, next(iter(known.values())), jump, pins)
    if recorded is None:
        return KeyOffer(host, name, key, KeyStatus.NEW, None, jump, pins)
    if recorded.key.asbytes() == key.asbytes():
        return KeyOffer(host, name, key, KeyStatus.KNOWN, None, jump, pins)
    return KeyOffer(host, name, key, KeyStatus.CHANGED, recorded, jump, pins)


def offers_for(host: Host, known_hosts: Path | None, timeout: float) -> tuple[KeyOffer, ...]:
    """The key of each hop to `host`, jump hosts first. Stops at the first hop not yet trusted:
    the hops behind it are reached only by logging in to it."""
    target = sshtarget.resolve(host)
    offers: list[KeyOffer] = []
    for index, hop in enumerate(target.hops):
        name = hostkeys.known_hosts_name(hop.hostname, hop.port)
        pins = hostkeys.pins_for(known_hosts, name)
        key = scan_host_key(host, known_hosts, index, timeout, preferred=list(hostkeys.first_pins(pins)))
        offers.append(classify(host.name, name, key, pins, hop.label if index < len(target.jumps) else None))
        if offers[-1].status is not KeyStatus.KNOWN:
            break
    return tuple(offers)


def changed_error(offer: KeyOffer, known_hosts: Path | None) -> MeshrunError:
    """Names the line(s) to delete, in whichever file holds them (`known_hosts`: the inventory's file)."""
    assert offer.known is not None
    return hostkeys.changed_key_error(offer.host, paramiko.BadHostKeyException(offer.name, offer.key, offer.known.key),
                                      known_hosts, offer.jump, offer.pins)


def trust(request: TrustRequest, renderer: Renderer, interactive: bool, confirm: Callable[[str], bool],
          project_root: Path) -> int:
    inventory = load_inventory(inventory_path(request.inventory, project_root), project_root)
    hosts = tuple(h for h in select_hosts(inventory, request.hosts).hosts if not h.is_local)
    sshtarget.check_all(hosts)  # a bad ssh_config value is one line before any host is contacted
    path = inventory.known_hosts or USER_KNOWN_HOSTS.expanduser()
    results = on_each(hosts, lambda h: offers_for(h, inventory.known_hosts, request.timeout),
                      timeout=request.timeout * (1 + sshtarget.MAX_HOPS) + 5)
    offers = [o for r in results.values() if isinstance(r, tuple) for o in r]
    print_host_keys(renderer, [(o.shown, o.name, f"{hostkeys.fingerprint(o.key)} ({o.key.get_name()})",
                                o.shown_status) for o in offers], str(path))
    problems = [changed_error(o, inventory.known_hosts) for o in offers if o.status is KeyStatus.CHANGED]
    problems += results.failed.values()
    new = _unique([o for o in offers if o.status is KeyStatus.NEW])
    if new and not request.yes:
        names = ", ".join(o.shown for o in new)
        if not interactive:
            raise MeshrunError(f"fab trust: {len(new)} new host key(s) ({names}) and no terminal to ask on; compare the "
                               "fingerprints above with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on each "
                               "host, then rerun with --yes")
        if not confirm(f"Trust the new key(s) of {names} and add them to {path}?"):
            raise MeshrunError(f"fab trust: nothing written; the key(s) of {names} stay untrusted")
    for offer in new:
        hostkeys.append_known_host(path, offer.name, offer.key)
        renderer.info(f"trusted {offer.shown}: {offer.name} {hostkeys.fingerprint(offer.key)} added to {path}")
        if offer.jump is not None:
            renderer.info(f"run `fab trust --hosts {offer.host}` again for the keys behind jump host {offer.jump}")
    if problems:
        raise MeshrunError("; ".join(str(p) for p in problems))
    if not new:
        renderer.info("nothing to do: every selected host's key is already trusted")
    return 0


def _unique(offers: list[KeyOffer]) -> list[KeyOffer]:
    """One line per known_hosts name and key: hosts behind one jump host all offer its key."""
    seen: set[tuple[str, bytes]] = set()
    kept = []
    for offer in offers:
        if (offer.name, offer.key.asbytes()) not in seen:
            seen.add((offer.name, offer.key.asbytes()))
            kept.append(offer)
    return kept


def _ask(question: str) -> bool:
    """The user's yes; end of input (Ctrl-D, a closed stdin) is a no: the caller then says nothing was written."""
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        print("(no answer: taken as no)")  # also ends the prompt's line, which Ctrl-D leaves open
        return False


def main(request: TrustRequest, project: Project) -> int:
    """`fab trust`: asks before adding keys when run at a terminal."""
    return trust(request, Renderer(), sys.stdin.isatty(), _ask, project.root)
