"""`--hosts`: host names, group names, or `host:0,1` (that host's GPUs for this run only); `--nnodes MIN:MAX`."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.fields import MAX_NODES, gpu_index_problem
from meshrun.deploy.inventory.model import ElasticBounds, Host, Inventory, Rendezvous
from meshrun.deploy.inventory.shown import clip, listing, shown, with_path

# ASCII digits only: str.isdigit() takes '²', which int() refuses; at most 4000 digits, as int() refuses 4300.
WHOLE_RE = re.compile(r"-?[0-9]{1,4000}")


def whole_number(text: str) -> int | None:
    """The int `text` spells in ASCII digits (with an optional minus), else None."""
    return int(text) if WHOLE_RE.fullmatch(text) else None


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
        """The inventory's rendezvous host, which must be selected; without one, the first selected host."""
        if not self.hosts:
            raise InputError("no hosts selected; pass --hosts NAME[,NAME...]")
        if self.rendezvous.host is None:
            return self.hosts[0]
        for host in self.hosts:
            if host.name == self.rendezvous.host:
                return host
        raise InputError(
            f"rendezvous host '{clip(self.rendezvous.host)}' is not among the selected hosts "
            f"({listing(h.name for h in self.hosts)}); add it to --hosts or change `rendezvous.host`"
        )

    def resumable(self) -> tuple[Selection, str | None]:
        """For `--resume`: a rendezvous host the inventory names but these hosts leave out (it died,
        the usual reason to resume without it: docs/elastic.md) gives way to the first selected host,
        as succession would have moved it, with the line that says so. A fresh run keeps `head`'s
        refusal: there the inventory's choice is the user's. Otherwise this selection, unchanged."""
        named = self.rendezvous.host
        if named is None or not self.hosts or any(h.name == named for h in self.hosts):
            return self, None
        moved = Selection(self.hosts, dataclasses.replace(self.rendezvous, host=None))
        return moved, (f"rendezvous host '{clip(named)}' (rendezvous.host) is not among the hosts of this resume; "
                       f"'{moved.head.name}' hosts its rendezvous instead")


def parse_hosts_flag(value: str) -> tuple[HostSpec, ...]:
    """Split `gpu1:0,1,lab,gpu2` into specs. Bare numbers continue the previous GPU list."""
    specs: list[HostSpec] = []
    pending_gpus: list[str] | None = None
    pending_name = ""
    # Only spaces around a name are dropped: a newline, tab or other control character stays part of the
    # name, which no host has, so `gpu1\n` is refused like `gpu1\n:0` (a blank item is just a separator).
    for token in (t.strip(" ") for t in value.split(",")):
        if not token.strip():
            continue
        if pending_gpus is not None and whole_number(token) is not None:
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
        raise InputError(f"--hosts {shown(value)}: no host named; pass e.g. --hosts gpu1,gpu2")
    return tuple(specs)


def _spec(name: str, raw: list[str]) -> HostSpec:
    numbers = [whole_number(item) for item in raw]
    values: list[object] = [item if number is None else number for item, number in zip(raw, numbers)]
    problem = gpu_index_problem(values)
    if problem is not None:
        raise InputError(f"--hosts: host {shown(name)}: {problem[0]}; {problem[1]}")
    return HostSpec(name, tuple(values))  # type: ignore[arg-type]


def select_hosts(inventory: Inventory, value: str | None) -> Selection:
    """The hosts a task acts on, in order of first mention; all hosts if `value` is empty. A GPU
    override (`gpu1:0`) holds against a plain mention of the same host, before or after it (its bare
    name, or a group holding it): `gpu1:0,lab` leaves the other GPUs of gpu1 to whoever kept them
    out. Two different overrides for one host are refused: which one was meant is not ours to guess."""
    if not value:
        return Selection(inventory.hosts, inventory.rendezvous)
    chosen: dict[str, Host] = {}
    overrides: dict[str, tuple[int, ...]] = {}
    for spec in parse_hosts_flag(value):
        for name in _expand(inventory, spec.name):
            if spec.gpus is None:
                chosen.setdefault(name, inventory.host(name))  # an earlier override stays
                continue
            if overrides.get(name, spec.gpus) != spec.gpus:
                raise InputError(f"--hosts: {clip(name)} is given GPUs {_gpu_list(overrides[name])} and then "
                                 f"{_gpu_list(spec.gpus)}; give it once")
            overrides[name] = spec.gpus
            chosen[name] = dataclasses.replace(inventory.host(name), gpus=spec.gpus, nproc=None)  # keeps its place
    return Selection(tuple(chosen.values()), inventory.rendezvous)


def _gpu_list(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus))


def _expand(inventory: Inventory, name: str) -> tuple[str, ...]:
    if name in inventory.host_names:
        return (name,)
    if name in inventory.groups:
        return inventory.groups[name]
    groups = f"; groups: {listing(inventory.groups)}" if inventory.groups else ""
    raise InputError(with_path(f"--hosts: unknown host {shown(name)} in ", inventory.path,
                               f"; known hosts: {listing(inventory.host_names)}{groups}"))


def parse_nnodes(value: str | None, inventory: Inventory, host_count: int) -> ElasticBounds | None:
    """`--nnodes MIN:MAX` wins over the inventory's `elastic:`; a plain count means no elasticity, and
    must be the number of selected hosts (torchrun's `--nnodes N` is how many take part: fewer would be
    silently ignored, as every selected host is launched)."""
    if not value:
        return inventory.elastic
    low, colon, high = value.partition(":")
    low_n, high_n = whole_number(low), whole_number(high) if colon else whole_number(low)
    if low_n is None or high_n is None or low.startswith("-") or high.startswith("-"):
        raise InputError(f"--nnodes {shown(value)}: expected MIN:MAX, e.g. --nnodes 2:3")
    bounds = ElasticBounds(low_n, high_n)
    if not 1 <= bounds.min <= bounds.max:
        raise InputError(f"--nnodes {shown(value)}: need 1 <= MIN <= MAX")
    if not colon and bounds.min != host_count:  # a fixed run is on every selected host: the count can only agree
        raise InputError(f"--nnodes {shown(value)}: {host_count} host{' is' if host_count == 1 else 's are'} "
                         f"selected; select {shown(bounds.min)} with --hosts, or give MIN:MAX for an elastic run")
    if bounds.min > host_count:
        raise InputError(f"--nnodes {shown(value)}: MIN {shown(bounds.min)} is more than the {host_count} "
                         "selected host(s)")
    if bounds.max > MAX_NODES:
        raise InputError(f"--nnodes {shown(value)}: MAX {shown(bounds.max)} is too large; write at most {MAX_NODES}")
    return bounds if colon else None
