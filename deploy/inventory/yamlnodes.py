"""Reading YAML as nodes, so every error can name the file and line of the offending field.

PyYAML's `safe_load` forgets line numbers and silently keeps the last of two duplicate keys;
composing nodes keeps both facts. Values are constructed with the safe constructor only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.errors import InputError


@dataclass(frozen=True)
class Where:
    """A place in an inventory file: the file, a 1-based line, and what sits there."""

    path: Path
    line: int
    host: str | None = None
    field: str | None = None

    def fail(self, problem: str, fix: str) -> InputError:
        """One-line error: `file:line: host 'h', field 'f': problem; fix`."""
        subject = []
        if self.host is not None:
            subject.append(f"host '{self.host}'")
        if self.field is not None:
            subject.append(f"field '{self.field}'")
        about = (", ".join(subject) + ": ") if subject else ""
        return InputError(f"{self.path}:{self.line}: {about}{problem}; {fix}")

    def at(self, node: yaml.Node, *, host: str | None = None, field: str | None = None) -> Where:
        return Where(
            self.path,
            node.start_mark.line + 1,
            host if host is not None else self.host,
            field if field is not None else self.field,
        )


def compose_file(path: Path) -> yaml.Node | None:
    """The root node of `path`, or None for an empty file. Errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{path}: inventory file not found; create it (examples in inventory/) "
            "or pass --inventory PATH / set MESHRUN_INVENTORY"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read the inventory ({err.__class__.__name__}); "
                         "pass a readable UTF-8 YAML file") from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = err.problem or err.context or "invalid YAML"
        raise InputError(f"{path}:{line}: YAML syntax error: {problem}; fix the YAML at that line") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: YAML error: {err}; fix the file") from None


def scalar(node: yaml.Node) -> Any:
    """The Python value of a scalar node (int, str, bool, float, None)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def mapping_items(node: yaml.Node, where: Where, what: str) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
    """(key, key_node, value_node) of a mapping node; rejects non-mappings and duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        raise where.at(node).fail(f"{what} must be a mapping (key: value lines)", f"write {what} as `key: value` pairs")
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            raise where.at(key_node).fail(f"keys in {what} must be names, got {key!r}", "use plain text keys")
        if key in seen:
            raise where.at(key_node).fail(
                f"duplicate key '{key}' in {what} (first on line {seen[key]})", "keep only one of them"
            )
        seen[key] = key_node.start_mark.line + 1
        yield key, key_node, value_node


def unknown_key(key: str, allowed: tuple[str, ...], where: Where, what: str) -> InputError:
    """Error for a key not in `allowed`, with a did-you-mean when one is close."""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
    return where.fail(f"unknown key '{key}'" + (f" in {what}" if what else ""), hint)
