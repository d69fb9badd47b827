"""Reading YAML as nodes, so every error can name the file and line of the offending field.

PyYAML's `safe_load` forgets line numbers and silently keeps the last of two duplicate keys;
composing nodes keeps both facts. Nothing is constructed: YAML 1.1 would make `0123` 83, `12:30`
750, `yes` true and `22:22` 1342, so every value is read as written (`written`), and a number is
only plain ASCII decimal digits (`whole_number`).

An inventory is input from a person and may be wrong in any way, so composing is bounded here
(`BoundedLoader`): a size cap, no control characters, no explicit tags, a nesting limit and a limit on
values counted with aliases expanded (an "alias bomb" of 330 bytes otherwise expands to millions).
PyYAML has none of these bounds; ruamel.yaml has only the nesting one (`max_depth`) and strictyaml
refuses flow style and anchors, which inventories use — so PyYAML's composer plus these bounds.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from meshrun.fsutil import FileRefused, read_regular
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import CLIP, shown, with_path

MAX_BYTES = 1 << 20  # an inventory is a list of hosts: a few kB. The cap bounds a wrong --inventory path too
MAX_DEPTH = 20  # an inventory needs 5 levels (inventory → hosts → host → env → value)
MAX_NODES = 100_000  # values with every alias expanded: bounds each walk over the document
MAX_MERGE_DEPTH = 8  # `<<: *a` where a itself merges b, ...
MERGE_TAG = "tag:yaml.org,2002:merge"
# The characters YAML itself refuses in a stream (PyYAML's Reader.NON_PRINTABLE), found by us first so
# the message names the line instead of a byte offset.
NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")
# What YAML 1.1 reads as null when it is written plain: a text field refuses it, an env value keeps it.
NULL_WORDS = frozenset(("", "~", "null", "Null", "NULL"))
# A whole number as the inventory takes one: ASCII decimal digits (the sign only so that -1 is named as negative);
# past 4000 digits it stays text (Python's int() refuses 4300).
WHOLE_NUMBER = re.compile(r"-?[0-9]{1,4000}")
PROBLEM_CLIP = 120  # characters of PyYAML's own problem text


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
            subject.append(f"host {shown(self.host)}")
        if self.field is not None:
            subject.append(f"field {shown(self.field)}")
        about = (", ".join(subject) + ": ") if subject else ""
        return InputError(with_path("", self.path, f":{self.line}: {about}{problem}; {fix}"))

    def at(self, node: yaml.Node, *, host: str | None = None, field: str | None = None) -> Where:
        return Where(
            self.path,
            node.start_mark.line + 1,
            host if host is not None else self.host,
            field if field is not None else self.field,
        )


class Refused(Exception):
    """A bound of `BoundedLoader` was hit: where (0-based line), what, and what to do."""

    def __init__(self, mark: yaml.Mark, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.line, self.problem, self.fix = mark.line + 1, problem, fix


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses explicit tags, deep nesting, re-used anchor names, aliases
    inside their own anchor, and documents of more than MAX_NODES values with aliases expanded."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.sizes: dict[int, int] = {}  # id(node) → its value count with aliases expanded
        self.depth = 0
        self.total = 0  # values so far, each alias counted as the values it repeats

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return self._alias(parent, index, event)
        if event.tag is not None:
            raise Refused(event.start_mark, f"YAML tag {shown(_short_tag(event.tag))} is not supported",
                          "remove the tag: inventories hold plain text, numbers, lists and mappings")
        if event.anchor is not None and event.anchor in self.anchors:
            first = self.anchors[event.anchor].start_mark.line + 1
            raise Refused(event.start_mark, f"anchor &{_clip(event.anchor, CLIP)} is defined twice "
                          f"(first on line {first})", "give each anchor its own name")
        if self.depth >= MAX_DEPTH:
            raise Refused(event.start_mark, f"values nested more than {MAX_DEPTH} levels deep",
                          "an inventory needs 5 (hosts → host → env → value); check the brackets and indentation")
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        self._count(node)
        return node

    def _alias(self, parent: yaml.Node | None, index: object, event: yaml.AliasEvent) -> yaml.Node:
        node = super().compose_node(parent, index)
        if id(node) not in self.sizes:
            raise Refused(event.start_mark, f"alias *{_clip(event.anchor, CLIP)} is used inside its own anchor",
                          "an alias may only repeat a value that is complete")
        self._add(self.sizes[id(node)], event.start_mark)
        return node

    def _count(self, node: yaml.Node) -> None:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        self.sizes[id(node)] = 1 + sum(self.sizes[id(child)] for child in children)
        self._add(1, node.start_mark)

    def _add(self, values: int, mark: yaml.Mark) -> None:
        """Count as we go, so a bomb stops at its first big alias and a huge file at MAX_NODES."""
        self.total += values
        if self.total > MAX_NODES:
            raise Refused(mark, f"more than {MAX_NODES} values, counting each alias as the values it repeats",
                          "an inventory of hosts needs far fewer: check the file (an alias bomb?)")


def _short_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def read_text(path: Path) -> str:
    """The file's text: a regular file of at most MAX_BYTES, UTF-8, no control characters. Errors name the file
    (and line)."""
    try:
        data = read_regular(path, MAX_BYTES)  # a FIFO is refused, not waited on; /dev/zero is not read
    except FileNotFoundError:
        raise InputError(with_path("", path, ": inventory file not found; create it (examples in inventory/) "
                                   "or pass --inventory PATH / set MESHRUN_INVENTORY")) from None
    except FileRefused as err:
        if err.too_large:
            raise InputError(with_path("", path, f": larger than {MAX_BYTES >> 20} MiB, too large for an inventory; "
                                       "check that --inventory names the inventory")) from None
        raise InputError(with_path("", path, f": {err}; pass the inventory's YAML file")) from None
    except OSError as err:  # no permission, a name too long, an I/O error
        raise InputError(with_path("", path, f": cannot read the inventory ({err.__class__.__name__}); "
                                   "pass a readable UTF-8 YAML file")) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(with_path("", path, ": cannot read the inventory (UnicodeDecodeError); "
                                   "pass a readable UTF-8 YAML file")) from None
    bad = NON_PRINTABLE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        raise InputError(with_path("", path, f":{line}: control character U+{ord(bad.group()):04X} in the file; "
                                   "remove it (an inventory is plain text)"))
    return text


def compose_file(path: Path) -> yaml.Node | None:
    """The root node of `path`, or None for an empty file. Errors name the file and line."""
    text = read_text(path)
    try:
        return yaml.compose(text, Loader=BoundedLoader)
    except Refused as err:
        raise InputError(with_path("", path, f":{err.line}: {err.problem}; {err.fix}")) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 1
        both = isinstance(err, yaml.composer.ComposerError) and err.context and err.problem
        problem = _clip(f"{err.context}, {err.problem}" if both else err.problem or err.context or "invalid YAML")
        raise InputError(with_path("", path, f":{line}: YAML syntax error: {problem}; "
                                   "fix the YAML at that line")) from None
    except yaml.YAMLError as err:
        raise InputError(with_path("", path, f": YAML error: {_clip(str(err))}; fix the file")) from None


def _clip(problem: str, limit: int = PROBLEM_CLIP) -> str:
    """Text from the input (PyYAML's problem quotes it, an anchor name): kept short and on one line."""
    text = problem if problem.isprintable() else repr(problem)[1:-1]
    return text if len(text) <= limit else text[:limit] + "…"


def written(node: yaml.ScalarNode) -> str:
    """A scalar exactly as the file writes it, never retyped: a plain scalar's own text (`0123`, `12:30`,
    `yes`, `1_000`, `0x10`, `~` stay so), a quoted or block scalar's value (`"a\\tb"` is a, tab, b)."""
    return node.value


def is_null(node: yaml.Node) -> bool:
    """A plain scalar YAML reads as null: nothing, `~` or `null`."""
    return isinstance(node, yaml.ScalarNode) and node.style is None and node.value in NULL_WORDS


def whole_number(node: yaml.ScalarNode) -> int | None:
    """The number a plain scalar of ASCII decimal digits writes (`022` is 22, never YAML 1.1's octal 18);
    None for anything else: `0x1F`, `0o17`, `1_000`, `22:22`, `+5`, `5.0`, `'5'` (quoted: text), `٣`."""
    if node.style is None and WHOLE_NUMBER.fullmatch(node.value):
        return int(node.value)
    return None


def kind(node: yaml.Node) -> str:
    """What a node is, in words, never its repr (a node's repr walks every alias: an alias bomb). A
    scalar is shown as written: a whole number bare (`0`), other text quoted, nothing as `nothing`."""
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if node.style is None and node.value == "":
        return "nothing"
    number = whole_number(node)
    return shown(number) if number is not None else shown(node.value)


def mapping_items(node: yaml.Node, where: Where, what: str) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
    """(key, key_node, value_node) of a mapping node; rejects non-mappings and duplicate keys.

    YAML merge keys (`<<: *defaults`, `<<: [*a, *b]`) are followed: their keys come first, the
    mapping's own keys override them, and of two merged mappings the earlier one wins.
    """
    return iter(_items(node, where, what, 0))


def _items(node: yaml.Node, where: Where, what: str, merges: int) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise where.at(node).fail(f"{what} must be a mapping (key: value lines)", f"write {what} as `key: value` pairs")
    merged: dict[str, tuple[str, yaml.Node, yaml.Node]] = {}
    own: list[tuple[str, yaml.Node, yaml.Node]] = []
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag == MERGE_TAG:
            for item in _merged(value_node, where.at(key_node), what, merges):
                merged.setdefault(item[0], item)
            continue
        key = written(key_node) if isinstance(key_node, yaml.ScalarNode) else None  # `ON:` is the name ON
        if key is None:
            raise where.at(key_node).fail(f"keys in {what} must be names, got {kind(key_node)}", "use plain text keys")
        if key in seen:
            raise where.at(key_node).fail(
                f"duplicate key {shown(key)} in {what} (first on line {seen[key]})", "keep only one of them"
            )
        seen[key] = key_node.start_mark.line + 1
        own.append((key, key_node, value_node))
    return [item for key, item in merged.items() if key not in seen] + own


def _merged(value: yaml.Node, at: Where, what: str, merges: int) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """The items a merge key brings: from one mapping or a list of them."""
    fix = "write `<<: *name` (an anchored mapping) or `<<: [*a, *b]`"
    if merges >= MAX_MERGE_DEPTH:
        raise at.fail(f"merge keys (`<<`) nested more than {MAX_MERGE_DEPTH} deep", "merge fewer levels")
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    items: list[tuple[str, yaml.Node, yaml.Node]] = []
    for source in sources:
        if not isinstance(source, yaml.MappingNode):
            raise at.fail(f"a merge key (`<<`) in {what} takes mappings, got {kind(source)}", fix)
        items += _items(source, at, what, merges + 1)
    return items


def unknown_key(key: str, allowed: tuple[str, ...], where: Where, what: str) -> InputError:
    """Error for a key not in `allowed`, with a did-you-mean when one is close."""
    close = difflib.get_close_matches(key[:100], allowed, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}"
    return where.fail(f"unknown key {shown(key)}" + (f" in {what}" if what else ""), hint)
