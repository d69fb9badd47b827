"""Validators for single inventory fields: a YAML node in, a typed value out, or a one-line error."""

from __future__ import annotations

import re
from typing import Callable, Mapping

import yaml

from deploy.inventory.model import Network
from deploy.inventory.yamlnodes import Where, mapping_items, scalar

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "text", type(None): "empty"}.get(
        type(value), type(value).__name__)


def _scalar_value(node: yaml.Node, at: Where, expected: str) -> object:
    if not isinstance(node, yaml.ScalarNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise at.fail(f"expected {expected}, got {kind}", f"write {expected}")
    return scalar(node)


def text(node: yaml.Node, at: Where) -> str:
    value = _scalar_value(node, at, "text")
    if not isinstance(value, str) or not value.strip():
        raise at.fail(f"expected non-empty text, got {_type_name(value)} {value!r}", "write a non-empty string")
    if any(c in value for c in "\n\r\0"):
        raise at.fail("contains a newline or NUL", "write it on one line")
    return value


def address(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    if any(c.isspace() for c in value) or value.startswith("-"):
        raise at.fail(f"'{value}' is not an address", "write an IP address, a host name or `local`")
    return value


def path_text(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    if value.startswith("~") and not (value == "~" or value.startswith("~/")):
        raise at.fail(f"'{value}': only `~` or `~/...` (the login user's home) is supported",
                      "write an absolute path or one starting with ~/")
    return value


USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def user(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    if not USER_RE.match(value):
        raise at.fail(f"'{value}' is not a login name", "use letters, digits, '.', '_' and '-'")
    return value


def port(node: yaml.Node, at: Where) -> int:
    value = _scalar_value(node, at, "a port number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise at.fail(f"expected a port number, got {_type_name(value)} {value!r}", "write a number from 1 to 65535")
    if not 1 <= value <= 65535:
        raise at.fail(f"port {value} is out of range", "write a number from 1 to 65535")
    return value


def positive_int(node: yaml.Node, at: Where) -> int:
    value = _scalar_value(node, at, "a whole number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise at.fail(f"expected a whole number, got {_type_name(value)} {value!r}", "write a number >= 1")
    if value < 1:
        raise at.fail(f"{value} is not >= 1", "write a number >= 1")
    return value


def batch_size(node: yaml.Node, at: Where) -> int | str:
    value = _scalar_value(node, at, "a batch size")
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise at.fail(f"expected a number >= 1 or `auto`, got {value!r}", "write e.g. `batch_size: 32` or `batch_size: auto`")
    return value


def gpus(node: yaml.Node, at: Where) -> tuple[int, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise at.fail(f"expected a list of GPU indices, got {_scalar_value(node, at, 'a list')!r}",
                      "write e.g. `gpus: [0, 1]`")
    values = [scalar(item) if isinstance(item, yaml.ScalarNode) else item for item in node.value]
    problem = gpu_index_problem(values)
    if problem is not None:
        raise at.fail(*problem)
    return tuple(values)  # type: ignore[arg-type]


def gpu_index_problem(values: list[object]) -> tuple[str, str] | None:
    """(problem, fix) if `values` is not a valid GPU list: non-empty, whole, >= 0, no repeats.

    Shared by the inventory's `gpus` and the `--hosts host:0,1` override.
    """
    if not values:
        return "the GPU list is empty", "list at least one index, or use `nproc` on a CPU host"
    seen: set[object] = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"GPU index {value!r} is not a whole number", "write indices as nvidia-smi shows them: 0, 1, ..."
        if value < 0:
            return f"GPU index {value} is negative", "write indices as nvidia-smi shows them: 0, 1, ..."
        if value in seen:
            return f"GPU index {value} is repeated", "list each GPU once"
        seen.add(value)
    return None


def network(node: yaml.Node, at: Where) -> Network:
    value = _scalar_value(node, at, "a network kind")
    allowed = [n.value for n in Network]
    if value not in allowed:
        raise at.fail(f"unknown network {value!r}", f"use one of: {', '.join(allowed)}")
    return Network(value)


def env(node: yaml.Node, at: Where) -> tuple[tuple[str, str], ...]:
    pairs = []
    for key, key_node, value_node in mapping_items(node, at, "env"):
        key_at = Where(at.path, key_node.start_mark.line + 1, at.host, f"env.{key}")
        if not ENV_NAME_RE.match(key):
            raise key_at.fail(f"'{key}' is not a valid environment variable name", "use letters, digits and _")
        value = _scalar_value(value_node, key_at, "a value")
        if value is None or isinstance(value, (list, dict)):
            raise key_at.fail(f"expected a value, got {_type_name(value)}", 'write it as text, e.g. OMP_NUM_THREADS: "1"')
        pairs.append((key, str(value).lower() if isinstance(value, bool) else str(value)))
    return tuple(pairs)


def name_list(node: yaml.Node, at: Where) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise at.fail("expected a list of host names", "write e.g. `lab: [gpu1, gpu2]`")
    return tuple(text(item, Where(at.path, item.start_mark.line + 1, at.host, at.field)) for item in node.value)


def check_name(name: str, at: Where, kind: str) -> None:
    if not NAME_RE.match(name):
        raise at.fail(f"{kind} name '{name}' has characters other than letters, digits, '.', '_' and '-'",
                      f"rename the {kind}")


FIELD_READERS: Mapping[str, Callable[[yaml.Node, Where], object]] = {
    "address": address,
    "ssh_address": address,
    "user": user,
    "port": port,
    "identity": path_text,
    "python": path_text,
    "workdir": path_text,
    "network": network,
    "gpus": gpus,
    "nproc": positive_int,
    "batch_size": batch_size,
    "env": env,
}
