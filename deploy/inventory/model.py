"""The inventory model: frozen dataclasses with their defaults on them. Pure, no I/O.

`deploy.inventory.load` builds these from YAML and checks every field once; code downstream
trusts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Iterable, Mapping

LOCAL = "local"  # `address: local` means this machine: subprocesses, no SSH
DEFAULT_RDZV_PORT = 29400


class Network(str, Enum):
    """How hosts reach each other; decides interface and NCCL settings."""

    ZEROTIER = "zerotier"
    WIREGUARD = "wireguard"
    LAN = "lan"
    PUBLIC = "public"

    @property
    def is_overlay_or_public(self) -> bool:
        """No InfiniBand over these: NCCL must not try it."""
        return self is not Network.LAN


@dataclass(frozen=True)
class Host:
    """One machine of the inventory, with defaults applied."""

    name: str
    address: str  # where training traffic goes, or "local"
    ssh_address: str | None
    user: str | None  # None: ssh_config's User for this host, else root (deploy.edges.sshtarget)
    port: int | None  # None: ssh_config's Port, else 22
    identity: str | None
    python: str | None  # None on a local host: the interpreter running the controller
    workdir: str
    network: Network
    gpus: tuple[int, ...] | None
    nproc: int | None
    batch_size: int | str | None  # an int, "auto", or None (the config's batch size)
    env: tuple[tuple[str, str], ...]
    site: str | None = None  # where the host is (docs/sites.md); None: a place of its own
    # A local host whose workdir is the controller's project itself (`workdir: .`), set at load where
    # the project is known: its `runs/<id>/` is the controller's run record, so a --script run's
    # ranks get a folder of their own there (deploy/run/plan.py `script_run_dir`).
    workdir_is_project: bool = False

    @property
    def is_local(self) -> bool:
        return self.address == LOCAL

    @property
    def ssh_host(self) -> str:
        """Where SSH connects: `ssh_address` if given, else `address`."""
        return self.ssh_address or self.address

    @property
    def nproc_per_node(self) -> int:
        """Processes on this host: one per selected GPU, else `nproc`, else 1."""
        if self.gpus is not None:
            return len(self.gpus)
        return self.nproc if self.nproc is not None else 1


def sites_of(hosts: Iterable[Host]) -> dict[str, str | None]:
    """Each host's `site:` by name (None: a place of its own), as the link plan and the report read it."""
    return {h.name: h.site for h in hosts}


@dataclass(frozen=True)
class Rendezvous:
    host: str | None  # None: the first selected host
    port: int = DEFAULT_RDZV_PORT


@dataclass(frozen=True)
class ElasticBounds:
    min: int
    max: int


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]]
    rendezvous: Rendezvous
    known_hosts: Path | None
    elastic: ElasticBounds | None
    notify: tuple[str, ...] = ()  # webhook receivers of every run (secrets: never shown or recorded)

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)
