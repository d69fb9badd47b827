"""The inventory: YAML → frozen, validated dataclasses. The only reader of inventory files.

Every field is checked once, here; code downstream trusts these objects. Each error is one
line naming the file, line, host and field, and what to do (see `deploy.inventory.yamlnodes.Where`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import yaml

from meshrun.deploy.errors import InputError
from meshrun.deploy.inputfiles import KNOWN_HOSTS_MAX, regular_file_problem
from meshrun.deploy.inventory import fields, localpaths
from meshrun.deploy.inventory.model import (DEFAULT_RDZV_PORT, ElasticBounds, Host, Inventory, Network,
                                     Rendezvous)
from meshrun.deploy.inventory.shown import clip, listing, shown, with_path
from meshrun.deploy.inventory.yamlnodes import Where, compose_file, is_null, mapping_items, unknown_key

# Where a project keeps its inventory; the first that exists is used (meshrun's own clone
# ships inventory/local.yaml, this machine alone).
PROJECT_INVENTORIES = (Path("inventory/hosts.yaml"), Path("inventory/local.yaml"))
USER_INVENTORY = Path("meshrun/inventory.yaml")  # under $XDG_CONFIG_HOME, default ~/.config
LOOKUP_ORDER = "--inventory, $MESHRUN_INVENTORY, the project's inventory/hosts.yaml or inventory/local.yaml, " \
               "~/.config/meshrun/inventory.yaml"


TOP_KEYS = ("defaults", "hosts", "groups", "rendezvous", "known_hosts", "elastic", "notify")
HOST_KEYS = ("address", "ssh_address", "user", "port", "identity", "python", "workdir", "network",
             "gpus", "nproc", "batch_size", "env", "site")
DEFAULT_KEYS = tuple(k for k in HOST_KEYS if k not in ("address", "ssh_address"))
# user/port None: ssh_config's for the host, else root/22 (deploy.edges.sshtarget).
BUILTIN_DEFAULTS: Mapping[str, object] = MappingProxyType(
    {"user": None, "port": None, "identity": None, "python": None, "workdir": "~/meshrun",
     "network": Network.LAN, "gpus": None, "nproc": None, "batch_size": None, "env": (),
     "site": None}
)


def inventory_path(cli_value: str | None, project_root: Path, env: Mapping[str, str] | None = None,
                   home: Path | None = None) -> Path:
    """The inventory to use, first found in LOOKUP_ORDER (docs/architecture.md, "Finding things").
    An explicit choice (flag or variable) is used as given, and fails later if it is missing."""
    env = os.environ if env is None else env
    if cli_value:
        return Path(cli_value)
    if env.get("MESHRUN_INVENTORY"):
        return Path(env["MESHRUN_INVENTORY"])
    for candidate in PROJECT_INVENTORIES:
        if (project_root / candidate).is_file():
            return project_root / candidate
    config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else (home or Path.home()) / ".config"
    if (config / USER_INVENTORY).is_file():
        return config / USER_INVENTORY
    fix = ' (README, "Many machines") or pass --inventory FILE'
    raise InputError(with_path(f"no inventory found (looked for {LOOKUP_ORDER}); write ",
                               project_root / PROJECT_INVENTORIES[0], fix))


def load_inventory(path: Path, project: Path | None = None) -> Inventory:
    """Parse and validate `path`. Raises InputError (exit 2) with a one-line message. `project`: the
    project root, where a relative `known_hosts`/`identity` is looked for when it is not beside the
    inventory, and which a local host's relative `workdir` must stay inside (`deploy/inventory/localpaths.py`)."""
    root = compose_file(path)
    where = Where(path, 1)
    if root is None:
        raise where.fail("the inventory is empty", 'add a `hosts:` section (README, "Many machines")')
    sections: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, key_node, value_node in mapping_items(root, where, "the inventory"):
        if key not in TOP_KEYS:
            raise unknown_key(key, TOP_KEYS, where.at(key_node), "the inventory")
        sections[key] = (key_node, value_node)
    if "hosts" not in sections:
        raise where.fail("no `hosts:` section", "list at least one host under `hosts:`")

    defaults = dict(BUILTIN_DEFAULTS)
    if "defaults" in sections:
        defaults.update(_read_fields(sections["defaults"][1], where, None, DEFAULT_KEYS, "defaults", project))
        _check_gpus_or_nproc(defaults, where.at(sections["defaults"][1], field="nproc"))
    hosts = _read_hosts(sections["hosts"][1], where, defaults, project)
    if project is not None:
        _check_local_workdirs(hosts, sections, where, project)
        hosts = tuple(dataclasses.replace(h, workdir_is_project=True) if h.is_local and
                      localpaths.workdir_is_project(h.workdir, project) else h for h in hosts)
    names = tuple(h.name for h in hosts)
    own_site = _hosts_with_own_site(sections["hosts"][1], where)
    groups, group_sites = (_read_groups(sections["groups"][1], where, names, own_site) if "groups" in sections
                           else ({}, {}))
    hosts = tuple(dataclasses.replace(h, site=group_sites[h.name][0]) if h.name in group_sites and h.name not in
                  own_site else h for h in hosts)
    rdzv = _read_rendezvous(sections["rendezvous"][1], where, names) if "rendezvous" in sections else Rendezvous(None)
    known_hosts = None
    if "known_hosts" in sections:
        text = fields.path_text(sections["known_hosts"][1], where.at(sections["known_hosts"][0], field="known_hosts"))
        known_hosts = localpaths.controller_file(text, path, project)
        if (problem := regular_file_problem(known_hosts, KNOWN_HOSTS_MAX)) is not None:  # /dev/zero, a FIFO
            raise where.at(sections["known_hosts"][0], field="known_hosts").fail(
                f"{shown(text)} {problem}", "point it at the file `fab trust` writes (it may not exist yet)")
    elastic = _read_elastic(sections["elastic"][1], where) if "elastic" in sections else None
    notify = fields.notify_urls(sections["notify"][1], where.at(sections["notify"][0], field="notify")) \
        if "notify" in sections else ()
    return Inventory(path, hosts, MappingProxyType(groups), rdzv, known_hosts, elastic, notify)


def _read_fields(node: yaml.Node, where: Where, host: str | None, allowed: tuple[str, ...], what: str,
                 project: Path | None) -> dict[str, object]:
    values: dict[str, object] = {}
    for key, key_node, value_node in mapping_items(node, where.at(node, host=host), what):
        at = where.at(key_node, host=host, field=key)
        if key not in allowed:
            raise unknown_key(key, allowed, where.at(key_node, host=host), what if host is None else "")
        values[key] = fields.FIELD_READERS[key](value_node, at)
        if key == "identity":
            values[key] = localpaths.key_file(str(values[key]), at, project)
    return values


def _check_gpus_or_nproc(values: Mapping[str, object], at: Where) -> None:
    if values.get("gpus") is not None and values.get("nproc") is not None:
        raise at.fail("both `gpus` and `nproc` are set",
                      "use `gpus` on a GPU host (one process per GPU) or `nproc` on a CPU host, not both")


def _read_hosts(node: yaml.Node, where: Where, defaults: Mapping[str, object],
                project: Path | None) -> tuple[Host, ...]:
    hosts: list[Host] = []
    addresses: dict[str, str] = {}
    folded: dict[str, str] = {}
    for name, key_node, value_node in mapping_items(node, where.at(node), "hosts"):
        at = where.at(key_node, host=name)
        fields.check_name(name, at, "host")
        if (twin := fields.case_twin(name, folded)) is not None:
            raise at.fail(f"host name {shown(name)} differs from host {shown(twin)} only in case",
                          "rename one: a macOS or Windows disk cannot tell their run files apart")
        own = ({} if _is_null(value_node) else
               _read_fields(value_node, where, name, HOST_KEYS, f"host '{name}'", project))
        if "address" not in own:
            raise at.fail("no `address`", "add `address: <overlay, LAN or public IP>` (or `address: local`)")
        _check_gpus_or_nproc(own, at)
        merged = {**defaults, "ssh_address": None, **own}
        # `env` is layered key by key, the host's keys winning: `defaults: env:` is "for every host", and a
        # host adding `NCCL_DEBUG` must not lose the defaults' WANDB_API_KEY. Every other field is replaced whole.
        merged["env"] = _merged_env(defaults["env"], own.get("env", ()))  # type: ignore[arg-type]
        if "gpus" in own:
            merged["nproc"] = None
        elif "nproc" in own:
            merged["gpus"] = None
        address = str(own["address"])
        if address in addresses:
            raise at.fail(f"address {clip(address)} is also host '{addresses[address]}'s",
                          "give each host its own address, or remove the duplicate")
        addresses[address] = name
        hosts.append(Host(name=name, **merged))  # type: ignore[arg-type]
    if not hosts:
        raise where.at(node).fail("`hosts:` is empty", "list at least one host")
    return tuple(hosts)


def _merged_env(defaults: tuple[tuple[str, str], ...], own: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The defaults' variables in their order, each the host's value where it sets one, then the host's own."""
    return tuple({**dict(defaults), **dict(own)}.items())


def _check_local_workdirs(hosts: tuple[Host, ...], sections: Mapping[str, tuple[yaml.Node, yaml.Node]], where: Where,
                          project: Path) -> None:
    """A local host's relative workdir is inside the project (`workdir: .` is the project itself): one
    that leads out of it, by `..` or a symlink, is refused at the line that set it."""
    for host in hosts:
        if host.is_local and localpaths.workdir_outside(host.workdir, project):
            places = [v for key, _, v in mapping_items(sections["hosts"][1], where, "hosts") if key == host.name]
            places += [sections["defaults"][1]] if "defaults" in sections else []
            at = next(where.at(k, host=host.name, field="workdir") for place in places if not _is_null(place)
                      for key, k, _ in mapping_items(place, where, "") if key == "workdir")
            raise at.fail(f"{shown(host.workdir)} leads out of the project (a local host's relative workdir is in "
                          "it)", "use `.` (the project itself), a folder in it, or an absolute path")


def _is_null(node: yaml.Node) -> bool:
    return is_null(node)


GROUP_KEYS = ("hosts", "site")  # a group is a list of hosts, or `{hosts: [...], site: NAME}`


def _read_groups(node: yaml.Node, where: Where, hosts: tuple[str, ...], own_site: frozenset[str]
                 ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, str]]]:
    """The groups, and per host the site its group gives it: ``{host: (site, group)}``. Two groups
    may give a host different sites only when the host has its own `site:`, which wins."""
    groups: dict[str, tuple[str, ...]] = {}
    sites: dict[str, tuple[str, str]] = {}
    for name, key_node, value_node in mapping_items(node, where.at(node), "groups"):
        at = where.at(key_node, field="groups")
        fields.check_name(name, at, "group")
        if name in hosts:
            raise at.fail(f"group {shown(name)} has the same name as a host", "rename the group")
        site, value_node = _group_site(value_node, where, name)
        members = fields.name_list(value_node, where.at(value_node, field="groups"))
        if not members:  # `--hosts NAME` would select nothing, and a task on nothing would "succeed"
            raise where.at(value_node, field="groups").fail(f"group {shown(name)} is empty",
                                                            "list at least one host, or remove the group")
        for member, member_node in zip(members, value_node.value):
            if member not in hosts:
                raise where.at(member_node, field="groups").fail(
                    f"group {shown(name)} names unknown host {shown(member)}", f"known hosts: {listing(hosts)}")
            if site is not None and member not in own_site and sites.get(member, (site,))[0] != site:
                raise where.at(member_node, field="groups").fail(
                    f"host {shown(member)} is in group {shown(sites[member][1])} at site {shown(sites[member][0])} "
                    f"and in group {shown(name)} at site {shown(site)}", "give the host its own `site:`, or one group")
            if site is not None:
                sites[member] = (site, name)
        groups[name] = members
    return groups, sites


def _group_site(node: yaml.Node, where: Where, name: str) -> tuple[str | None, yaml.Node]:
    """(site, the list of hosts) of a group written as a list or as `{hosts: [...], site: NAME}`."""
    if not isinstance(node, yaml.MappingNode):
        return None, node
    found: dict[str, yaml.Node] = {}
    for key, key_node, value_node in mapping_items(node, where.at(node), f"group {shown(name)}"):
        if key not in GROUP_KEYS:
            raise unknown_key(key, GROUP_KEYS, where.at(key_node, field="groups"), f"group {shown(name)}")
        found[key] = value_node
    if "hosts" not in found:
        raise where.at(node, field="groups").fail(f"group {shown(name)} has no `hosts:`",
                                                  "write `{hosts: [gpu1, gpu2], site: office}`")
    site = fields.site(found["site"], where.at(found["site"], field="site")) if "site" in found else None
    return site, found["hosts"]


def _hosts_with_own_site(node: yaml.Node, where: Where) -> frozenset[str]:
    """The hosts that write their own `site:`: it wins over their groups' and the defaults'."""
    return frozenset(name for name, _, value_node in mapping_items(node, where, "hosts")
                     if not _is_null(value_node)
                     and any(key == "site" for key, _, _ in mapping_items(value_node, where, "")))


def _read_rendezvous(node: yaml.Node, where: Where, hosts: tuple[str, ...]) -> Rendezvous:
    host, port = None, DEFAULT_RDZV_PORT
    for key, key_node, value_node in mapping_items(node, where.at(node), "rendezvous"):
        at = where.at(key_node, field=f"rendezvous.{key}")
        if key == "host":
            host = fields.text(value_node, at)
            if host not in hosts:
                raise at.fail(f"rendezvous host {shown(host)} is not in `hosts`", f"use one of: {listing(hosts)}")
        elif key == "port":
            port = fields.port(value_node, at)
        else:
            raise unknown_key(key, ("host", "port"), where.at(key_node), "rendezvous")
    return Rendezvous(host, port)


def _read_elastic(node: yaml.Node, where: Where) -> ElasticBounds:
    values: dict[str, int] = {}
    for key, key_node, value_node in mapping_items(node, where.at(node), "elastic"):
        if key not in ("min", "max"):
            raise unknown_key(key, ("min", "max"), where.at(key_node), "elastic")
        values[key] = fields.nodes(value_node, where.at(key_node, field=f"elastic.{key}"))
    at = where.at(node, field="elastic")
    if set(values) != {"min", "max"}:
        raise at.fail("needs both `min` and `max`", "write `elastic: {min: 2, max: 3}`")
    if values["min"] > values["max"]:
        raise at.fail(f"min {shown(values['min'])} is greater than max {shown(values['max'])}", "make min <= max")
    return ElasticBounds(values["min"], values["max"])
