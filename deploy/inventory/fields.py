"""Validators for single inventory fields: a YAML node in, a typed value out, or a one-line error.

Every value is read as written (`yamlnodes.written`), never as YAML 1.1 would retype it: text stays the
text in the file, an `env` value reaches the host exactly so, and a number is plain ASCII decimal digits.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping
from urllib.parse import urlsplit

import yaml

from meshrun.deploy.inventory import reservedenv
from meshrun.deploy.inventory.model import Network
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.inventory.yamlnodes import Where, is_null, kind, mapping_items, whole_number, written

# Patterns are used with fullmatch: `$` would also match before a trailing newline ("gpu1\n").
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME = 64  # a host or group name; a DNS label is 63
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Host names, IPv4, IPv6 (with a %zone): what `ssh` and torch's store take as a host, nothing a shell reads.
ADDRESS_RE = re.compile(r"[A-Za-z0-9._:%-]+")
# `host:2222` or `[::1]:2222`; an IPv6 address has two colons or more, so it never matches.
HOST_PORT_RE = re.compile(r"\[[^\]]*\]:.*|[^:]*:[^:]*")
MAX_GPU_INDEX = 1023  # larger is a typo: CUDA counts the GPUs of one machine
MAX_NPROC = MAX_GPU_INDEX + 1  # processes on one host: more is a typo, and torchrun would try to start them
MAX_BATCH = 1 << 24  # samples per rank per step; more is a typo that would end in an allocation failure on the host
MAX_NODES = 10_000  # hosts in an elastic range; docs/scale.md plans for 1000


def _scalar(node: yaml.Node, at: Where, expected: str) -> yaml.ScalarNode:
    if not isinstance(node, yaml.ScalarNode):
        raise at.fail(f"expected {expected}, got {kind(node)}", f"write {expected}")
    return node


def _as_text(node: yaml.ScalarNode) -> str:
    """How a message names a value that is not the number it should be: `text '0x1F'`, or `nothing`."""
    return "nothing" if is_null(node) and not node.value else f"text {shown(written(node))}"


def text(node: yaml.Node, at: Where) -> str:
    value = written(_scalar(node, at, "text"))
    if is_null(node):
        if value:  # `~`, `null`: refused rather than kept, since YAML users write them to mean "no value"
            raise at.fail(f"expected non-empty text, got {value}, which YAML reads as null",
                          f"write a non-empty string (quoted, '{value}', if you mean that text)")
        raise at.fail("expected non-empty text, got nothing", "write a non-empty string")
    if not value.strip():
        raise at.fail(f"expected non-empty text, got text {shown(value)}", "write a non-empty string")
    unprintable(value, at)
    return value


def unprintable(value: str, at: Where) -> None:
    """Refuse control and other unprintable characters (NUL, newline, ESC, BEL, U+202E, ...): they end
    argv strings, split log lines or rewrite the terminal."""
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise at.fail(f"{shown(value)} contains the unprintable character U+{ord(bad):04X}",
                      "write it on one line, in printable characters")


def address(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    field = at.field or "address"
    if "@" in value:
        raise at.fail(f"{shown(value)} holds a login name",
                      f"put the login name in `user:` and only the host in `{field}:`")
    if HOST_PORT_RE.fullmatch(value):
        raise at.fail(f"{shown(value)} holds a port", f"put the port in `port:` and only the host in `{field}:`")
    if not ADDRESS_RE.fullmatch(value) or value.startswith("-"):
        raise at.fail(f"{shown(value)} is not an address", "write an IP address, a host name or `local`")
    return value


def path_text(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    if value.startswith("~") and not (value == "~" or value.startswith("~/")):
        raise at.fail(f"{shown(value)}: only `~` or `~/...` (the login user's home) is supported",
                      "write an absolute path or one starting with ~/")
    if value.startswith("-"):  # on a host's command line (mkdir, cd, exec) it would read as an option
        raise at.fail(f"{shown(value)} starts with '-', which commands read as an option",
                      f"write it as ./{value}")
    return value


def identity(node: yaml.Node, at: Where) -> str:
    """A private key file on this machine, as written; the loader finds it and checks it is a file
    (`deploy/inventory/localpaths.key_file`: a relative one is beside the inventory, never in the cwd)."""
    return path_text(node, at)


USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def user(node: yaml.Node, at: Where) -> str:
    value = text(node, at)
    if not USER_RE.fullmatch(value):
        raise at.fail(f"{shown(value)} is not a login name", "use letters, digits, '.', '_' and '-'")
    return value


def _number(node: yaml.Node, at: Where, expected: str, fix: str) -> int:
    """A plain whole number in ASCII decimal digits: `0x1F`, `0o17`, `1_000`, `22:22` (YAML 1.1's 1342),
    `+5`, `5.0`, `"5"` and `٣` are refused, `022` is 22."""
    scalar = _scalar(node, at, expected)
    value = whole_number(scalar)
    if value is None:
        raise at.fail(f"expected {expected}, got {_as_text(scalar)}", fix)
    return value


def port(node: yaml.Node, at: Where) -> int:
    value = _number(node, at, "a port number", "write a number from 1 to 65535")
    if not 1 <= value <= 65535:
        raise at.fail(f"port {shown(value)} is out of range", "write a number from 1 to 65535")
    return value


def positive_int(node: yaml.Node, at: Where, maximum: int) -> int:
    value = _number(node, at, "a whole number", f"write a number from 1 to {maximum}")
    if value < 1:
        raise at.fail(f"{shown(value)} is not >= 1", f"write a number from 1 to {maximum}")
    if value > maximum:
        raise at.fail(f"{shown(value)} is too large", f"write a number from 1 to {maximum}")
    return value


def nproc(node: yaml.Node, at: Where) -> int:
    return positive_int(node, at, MAX_NPROC)


def nodes(node: yaml.Node, at: Where) -> int:
    return positive_int(node, at, MAX_NODES)


def batch_size(node: yaml.Node, at: Where) -> int | str:
    scalar = _scalar(node, at, "a batch size")
    if written(scalar) == "auto":
        return "auto"
    value = whole_number(scalar)
    if value is None or value < 1:
        raise at.fail(f"expected a number >= 1 or `auto`, got {kind(scalar)}",
                      "write e.g. `batch_size: 32` or `batch_size: auto`")
    if value > MAX_BATCH:
        raise at.fail(f"batch size {shown(value)} is too large", f"write a number from 1 to {MAX_BATCH}, or `auto`")
    return value


def gpus(node: yaml.Node, at: Where) -> tuple[int, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise at.fail(f"expected a list of GPU indices, got {kind(node)}", "write e.g. `gpus: [0, 1]`")
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode):
            raise at.fail(f"GPU index {kind(item)} is not a whole number", "write e.g. `gpus: [0, 1]`")
    numbers = [whole_number(item) for item in node.value]
    values = [written(item) if number is None else number for item, number in zip(node.value, numbers)]
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
    as_shown = "write indices as nvidia-smi shows them:"
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"GPU index {shown(value)} is not a whole number", f"{as_shown} 0, 1, ..."
        if value < 0:
            return f"GPU index {shown(value)} is negative", f"{as_shown} 0, 1, ..."
        if value > MAX_GPU_INDEX:
            return f"GPU index {shown(value)} is too large", f"{as_shown} 0 to {MAX_GPU_INDEX}"
        if value in seen:
            return f"GPU index {value} is repeated", "list each GPU once"
        seen.add(value)
    return None


def network(node: yaml.Node, at: Where) -> Network:
    value = written(_scalar(node, at, "a network kind"))
    allowed = [n.value for n in Network]
    if value not in allowed:
        raise at.fail(f"unknown network {shown(value)}", f"use one of: {', '.join(allowed)}")
    return Network(value)


def env(node: yaml.Node, at: Where) -> tuple[tuple[str, str], ...]:
    pairs = []
    for key, key_node, value_node in mapping_items(node, at, "env"):
        key_at = Where(at.path, key_node.start_mark.line + 1, at.host, f"env.{key}")
        if not ENV_NAME_RE.fullmatch(key):
            raise key_at.fail(f"{shown(key)} is not a valid environment variable name", "use letters, digits and _")
        value = written(_scalar(value_node, key_at, "a value"))  # 0123, 12:30, yes, ~: as written
        if (reserved := reservedenv.refused(key)) is not None:  # it would beat `batch_size:` or torchrun's world
            raise key_at.fail(*reserved)
        if is_null(value_node) and not value:
            raise key_at.fail("expected a value, got nothing", 'write it as text, e.g. OMP_NUM_THREADS: "1" (or "")')
        if "\0" in value:
            # Values go to a process environment, never to a terminal or an argv: a newline or a tab
            # is legitimate there (a PEM key, a list). NUL is the one thing an environment cannot hold.
            raise key_at.fail(f"{shown(value)} contains the unprintable character U+0000",
                              "an environment value cannot hold a NUL byte; remove it")
        pairs.append((key, value))
    return tuple(pairs)


def name_list(node: yaml.Node, at: Where) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise at.fail("expected a list of host names", "write e.g. `lab: [gpu1, gpu2]`")
    return tuple(text(item, Where(at.path, item.start_mark.line + 1, at.host, at.field)) for item in node.value)


def site(node: yaml.Node, at: Where) -> str:
    """A place name (`office`, `home-1`): the same letters as a host name, so it is plain text everywhere."""
    value = written(_scalar(node, at, "a site name"))
    if is_null(node) and not value:
        raise at.fail("expected a site name, got nothing", "write e.g. `site: office`, or remove the line")
    check_name(value, at, "site")
    return value


def check_name(name: str, at: Where, noun: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise at.fail(f"{noun} name {shown(name)} has characters other than letters, digits, '.', '_' and '-'",
                      f"rename the {noun}")
    if len(name) > MAX_NAME:
        raise at.fail(f"{noun} name {shown(name)} is longer than {MAX_NAME} characters", f"rename the {noun}")


def case_twin(name: str, seen: dict[str, str]) -> str | None:
    """The name in `seen` (keyed by casefold) that differs from `name` only in case, or None; `name`
    is added to `seen`. Host names are file names in the runs folder (logs/HOST.log, hosts/HOST/,
    .placed/HOST.json), and a macOS or Windows disk is case-insensitive: `gpu1` and `GPU1` would
    share them. An exact repeat is a duplicate key, refused by the YAML reader."""
    twin = seen.setdefault(name.casefold(), name)
    return twin if twin != name else None


FIELD_READERS: Mapping[str, Callable[[yaml.Node, Where], object]] = {
    "address": address,
    "ssh_address": address,
    "user": user,
    "port": port,
    "identity": identity,
    "python": path_text,
    "workdir": path_text,
    "network": network,
    "gpus": gpus,
    "nproc": nproc,
    "batch_size": batch_size,
    "env": env,
    "site": site,
}


URL_MAX = 2048


def url_problem(url: object) -> str | None:
    """Why `url` is not a webhook receiver meshrun posts to (`notify:`, `--notify`), or None. The
    reason never quotes the URL: it often holds a token."""
    if not isinstance(url, str) or not url:
        return "empty"
    if len(url) > URL_MAX or not url.isprintable() or any(c.isspace() for c in url):
        return "not a URL (too long, or spaces or control characters in it)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL with a host"
    return None


def notify_urls(node: yaml.Node, at: Where) -> tuple[str, ...]:
    """`notify:`: one receiver URL or a list of them. A bad one is named by its line, never quoted."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    urls = []
    for item in items:
        problem = url_problem(written(item)) if isinstance(item, yaml.ScalarNode) else "not text"
        if problem:
            raise at.at(item).fail(f"{problem} (the value is not shown: it may hold a token)",
                                   "write an http:// or https:// URL")
        urls.append(written(item))
    return tuple(urls)
