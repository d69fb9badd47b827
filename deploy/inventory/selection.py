"""`--hosts`: host names, group names, or `host:0,1` (that host's GPUs for this run only)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from deploy.errors import InputError
from deploy.inventory.fields import gpu_index_problem
from deploy.inventory.model import Host, Inventory, Rendezvous


@dataclass(frozen=True)
class HostSpec:
    """One `--hosts` item: a host or group name, and an optional GPU override."""

    name: str
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Selection:
    """The hosts a task acts on and the rendezvous host among them, decided here and only here."""

    hosts: tuple[Host, ...]
    rendezvous: Rendezvous

    @property
    def head(self) -> Host:
        """The inventory's rendezvous host if selected, else the first selected host."""
        if not self.hosts:
            raise InputError("no hosts selected; pass --hosts NAME[,NAME...]")
        if self.rendezvous.host is None:
            return self.hosts[0]
        for host in self.hosts:
            if host.name == self.rendezvous.host:
                return host
        raise InputError(
            f"rendezvous host '{self.rendezvous.host}' is not among the selected hosts "
            f"({', '.join(h.name for h in self.hosts)}); add it to --hosts or change `rendezvous.host`"
        )


def parse_hosts_flag(value: str) -> tuple[HostSpec, ...]:
    """Split `gpu1:0,1,lab,gpu2` into specs. Bare numbers continue the previous GPU list."""
    specs: list[HostSpec] = []
    pending_gpus: list[str] | None = None
    pending_name = ""
    for token in (t.strip() for t in value.split(",")):
        if not token:
            continue
        if pending_gpus is not None and token.lstrip("-").isdigit():
            pending_gpus.append(token)
            continue
        if pending_gpus is not None:
            specs.append(_spec(pending_name, pending_gpus))
            pending_gpus = None
        name, colon, first = token.partition(":")
        if colon:
            pending_name, pending_gpus = name, [first] if first else []
        else:
            specs.append(HostSpec(token))
    if pending_gpus is not None:
        specs.append(_spec(pending_name, pending_gpus))
    if not specs:
        raise InputError(f"--hosts '{value}': no host named; pass e.g. --hosts gpu1,gpu2")
    return tuple(specs)


def _spec(name: str, raw: list[str]) -> HostSpec:
    values: list[object] = [int(item) if item.lstrip("-").isdigit() else item for item in raw]
    problem = gpu_index_problem(values)
    if problem is not None:
        raise InputError(f"--hosts: host '{name}': {problem[0]}; {problem[1]}")
    return HostSpec(name, tuple(values))  # type: ignore[arg-type]


def select_hosts(inventory: Inventory, value: str | None) -> Selection:
    """The hosts a task acts on, in inventory order of first mention; all hosts if `value` is empty."""
    if not value:
        return Selection(inventory.hosts, inventory.rendezvous)
    chosen: dict[str, Host] = {}
    for spec in parse_hosts_flag(value):
        for name in _expand(inventory, spec.name):
            host = inventory.host(name)
            if spec.gpus is not None:
                host = dataclasses.replace(host, gpus=spec.gpus, nproc=None)
            chosen[name] = host
    return Selection(tuple(chosen.values()), inventory.rendezvous)


def _expand(inventory: Inventory, name: str) -> tuple[str, ...]:
    if name in inventory.host_names:
        return (name,)
    if name in inventory.groups:
        return inventory.groups[name]
    groups = f"; groups: {', '.join(inventory.groups)}" if inventory.groups else ""
    raise InputError(
        f"--hosts: unknown host '{name}' in {inventory.path}; known hosts: {', '.join(inventory.host_names)}{groups}"
    )
