"""meshrun inventory YAML + known_hosts for the simulated hosts.

The inventory is meshrun's user contract; tests drive meshrun exactly as a user
would, through a file written here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RENDEZVOUS_PORT = 29400
DEFAULT_WORKDIR = "~/meshrun"


@dataclass(frozen=True)
class HostEntry:
    """What the inventory says about one simulated host before overrides."""

    name: str
    address: str
    ssh_address: str | None  # set with the overlay: SSH goes over the LAN
    host_key: str  # "ssh-ed25519 AAAA..."


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Shallow merge; a value of None deletes the key (to test missing fields)."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def build(
    entries: list[HostEntry],
    *,
    identity: Path,
    python: str,
    network: str,
    known_hosts: Path,
    host_overrides: Mapping[str, Mapping[str, Any]],
    defaults_overrides: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    unknown = set(host_overrides) - {e.name for e in entries}
    if unknown:
        raise ValueError(f"host_overrides for hosts not in the inventory: {sorted(unknown)}")
    defaults = _merge(
        {"user": "root", "port": 22, "identity": str(identity), "python": python,
         "workdir": DEFAULT_WORKDIR, "network": network},
        defaults_overrides,
    )
    hosts: dict[str, Any] = {}
    for e in entries:
        base: dict[str, Any] = {"address": e.address}
        if e.ssh_address is not None:
            base["ssh_address"] = e.ssh_address
        hosts[e.name] = _merge(base, host_overrides.get(e.name, {}))
    doc: dict[str, Any] = {
        "defaults": defaults,
        "hosts": hosts,
        "rendezvous": {"host": entries[0].name, "port": RENDEZVOUS_PORT},
        "known_hosts": str(known_hosts),
    }
    return _merge(doc, extra)


def known_hosts_lines(doc: Mapping[str, Any], entries: list[HostEntry]) -> list[str]:
    """One line per host, for the address and port SSH will connect to (after
    overrides); non-22 ports use OpenSSH's ``[addr]:port`` form."""
    keys = {e.name: e.host_key for e in entries}
    default_port = int(doc["defaults"].get("port", 22))
    lines = []
    for name, spec in doc["hosts"].items():
        addr = spec.get("ssh_address") or spec["address"]
        port = int(spec.get("port", default_port))
        target = addr if port == 22 else f"[{addr}]:{port}"
        lines.append(f"{target} {keys[name]}")
    return lines


def check_workdir(doc: Mapping[str, Any], passthrough: list[Path]) -> None:
    """Refuse a workdir that is a passthrough dir of the real /root (e.g. the
    checkout cloned to /root/meshrun): every host would write the same place,
    i.e. the checkout itself."""
    shared = {p.name for p in passthrough}
    workdirs = [doc["defaults"].get("workdir", "")]
    workdirs += [spec.get("workdir", "") for spec in doc["hosts"].values()]
    for workdir in workdirs:
        if isinstance(workdir, str) and workdir.startswith("~/"):
            top = workdir[2:].split("/", 1)[0]
            if top in shared:
                raise ValueError(
                    f"workdir {workdir} lies in /root/{top}, which is shared into every "
                    "simulated host; pass defaults_overrides={'workdir': ...} elsewhere"
                )


class _Flow(dict):  # type: ignore[type-arg]
    """A mapping dumped inline: `h1: {address: 10.77.0.11}`."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping(
        "tag:yaml.org,2002:map", data.items(), flow_style=True)
)


def dump(doc: Mapping[str, Any], path: Path) -> None:
    """Block style, except one line per host and for the rendezvous, like the
    examples in meshrun's docs."""
    styled = dict(doc)
    if isinstance(styled.get("hosts"), dict):
        styled["hosts"] = {name: _Flow(spec) for name, spec in styled["hosts"].items()}
    if isinstance(styled.get("rendezvous"), dict):
        styled["rendezvous"] = _Flow(styled["rendezvous"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.dump(styled, Dumper=_Dumper, sort_keys=False, width=1000))
