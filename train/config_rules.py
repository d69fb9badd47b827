"""What a trainer config may be: how its YAML is read (``YamlLoader``), and the range of every numeric
key: what torch or the trainer's code accepts, and no value that is clearly meaningless.
``train.config`` has already made every float finite.

Contract: ``YamlLoader`` composes with bounds (nesting, values with aliases expanded) and refuses a
duplicate key, raising ``Refused`` with the line and a one-line problem naming the key. ``shown(value)``
is a value as a message quotes it: escaped, at most SHOWN_MAX characters. ``check_ranges(cfg, source)``
returns or raises ``UsageError`` with one line naming the
source, the dotted key, the allowed range and the value. One rule per key; a rule that allows 0
says what 0 means. Then the settings that cannot go together (``check_combinations``): one line
naming the source, both keys and what to do. Dataset- or model-specific limits
(``data.num_classes`` of ``shapes``, ``model.sa_points`` levels) are checked where that dataset
or model is built.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

import yaml

from meshrun.train.errors import UsageError
from meshrun.train.kinds import CommHook

SEED_MAX = 2**32 - 1  # numpy's RandomState takes [0, 2**32); torch 2**64 - 1, but gets seed * 100_003 + epoch
PG_TIMEOUT_MAX_S = 86_400  # as the controller's --timeout (deploy/run/flags.py): a day
BUCKET_CAP_MAX_MB = 1 << 20  # 1 TiB; DDP gives C++ int(MiB * 2**20) bytes as a 64-bit size
# Past these a value is a typo that passes --check and then fails on every host after an epoch (a sampler
# refuses a batch past sys.maxsize, a width past memory, a DataLoader forks that many workers and hangs).
BATCH_MAX = 1 << 24  # as the inventory's batch_size (deploy/inventory/fields.MAX_BATCH; train/ may not import it)
WORKERS_MAX = 1024  # DataLoader processes per rank
WIDTH_MAX = 1 << 20  # one layer's units or channels
SHOWN_MAX = 80  # characters of a value quoted in a message: it may come from a file of any size

# Bounds on composing YAML, as the inventory's (deploy/inventory/yamlnodes.BoundedLoader, which train/ may not
# import: docs/architecture.md): PyYAML recurses once per level (about 500 overflow the stack) and an alias
# repeats its value for free (330 bytes of nested aliases are 43 million values).
MAX_DEPTH = 20  # a config needs 4 levels: section, key, list, value
MAX_NODES = 100_000  # values, each alias counted as the values it repeats
INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
MERGE_TAG = "tag:yaml.org,2002:merge"
DECIMAL_INT = r"[-+]?(?:0|[1-9][0-9]*)"
RESOLVED_INT = r"[-+]?(?:0|[1-9][0-9]{0,3999})"  # longer stays text: int() refuses 4300 digits
DECIMAL_FLOAT = r"[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"


class Refused(Exception):
    """A bound of `YamlLoader` was hit: the 1-based line and the problem, with the key and what to do."""

    def __init__(self, mark: yaml.Mark, problem: str) -> None:
        super().__init__(problem)
        self.line, self.problem = mark.line + 1, problem


class YamlLoader(yaml.SafeLoader):
    """``yaml.safe_load`` with plain decimal numbers: YAML 1.1 reads 0x10, 010 (octal), 0b1, 1_000
    and 1:20 (base 60) as integers, .inf and .nan as floats; here they stay text, which a number
    key refuses. 1e-4 is a float (PyYAML's own rule wants a dot and a signed exponent).
    Composing is bounded (MAX_DEPTH, MAX_NODES) and a duplicate key is refused, as the inventory's:
    PyYAML would keep the last of two `lr:` lines without a word."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.sizes: dict[int, int] = {}  # id(node) -> its value count with aliases expanded
        self.keys: list[str] = []  # the keys above the node being composed ("" for a list item)
        self.total = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self.sizes:
                raise Refused(event.start_mark, f"{self._about(index)}an alias is used inside its own anchor; "
                              "an alias may only repeat a value that is complete")
            return self._add(node, self.sizes[id(node)], event.start_mark, index)
        if len(self.keys) >= MAX_DEPTH:
            raise Refused(event.start_mark, f"{self._about(index)}values nested more than {MAX_DEPTH} levels "
                          "deep; a config needs 4 (section, key, list, value): check the brackets")
        self.keys.append(index.value if isinstance(index, yaml.ScalarNode) else "")
        try:
            node = super().compose_node(parent, index)
            children = node.value if isinstance(node, yaml.SequenceNode) else []
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in self._unique(node) for n in pair]
        finally:
            self.keys.pop()
        self.sizes[id(node)] = 1 + sum(self.sizes[id(child)] for child in children)
        return self._add(node, 1, node.start_mark, index)

    def _key(self, index: object) -> str:
        """The dotted key of the node at `index` (a mapping's key node, or a list position), quoted."""
        keys = [k for k in self.keys if k] + ([index.value] if isinstance(index, yaml.ScalarNode) else [])
        return shown(".".join(keys)) if keys else ""

    def _about(self, index: object) -> str:
        key = self._key(index)
        return f"{key}: " if key else ""

    def _unique(self, node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
        first: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != MERGE_TAG:
                if key_node.value in first:
                    raise Refused(key_node.start_mark, f"duplicate key {self._key(key_node)} (first on line "
                                  f"{first[key_node.value]}); keep only one of them")
                first[key_node.value] = key_node.start_mark.line + 1
        return node.value

    def _add(self, node: yaml.Node, values: int, mark: yaml.Mark, index: object) -> yaml.Node:
        """Count as we go, so a bomb stops at its first big alias and a huge file at MAX_NODES."""
        self.total += values
        if self.total > MAX_NODES:
            raise Refused(mark, f"{self._about(index)}more than {MAX_NODES} values, counting each alias as the "
                          "values it repeats; a config needs far fewer (an alias bomb?)")
        return node


YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag not in (INT_TAG, FLOAT_TAG)]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
YamlLoader.add_implicit_resolver(INT_TAG, re.compile(RESOLVED_INT + r"\Z"), list("-+0123456789"))
YamlLoader.add_implicit_resolver(FLOAT_TAG, re.compile(DECIMAL_FLOAT + r"\Z"), list("-+0123456789."))


RANGES: tuple[tuple[str, Any, str], ...] = (
    ("seed", lambda v: 0 <= v <= SEED_MAX, f"in [0, {SEED_MAX}]"),
    ("epochs", lambda v: v >= 0, ">= 0"),
    ("model.hidden", lambda v: all(1 <= w <= WIDTH_MAX for w in v), f"a list of widths in [1, {WIDTH_MAX}]"),
    ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model.sa_points", lambda v: all(n >= 1 for n in v), "a list of centroid counts >= 1"),
    ("model.sa_radius", lambda v: all(r > 0 for r in v), "a list of radii > 0"),
    ("model.sa_samples", lambda v: v >= 1, ">= 1"),
    ("model.width", lambda v: 1 <= v <= WIDTH_MAX, f"in [1, {WIDTH_MAX}]"),
    ("data.batch_size", lambda v: 1 <= v <= BATCH_MAX, f"in [1, {BATCH_MAX}]"),
    ("data.eval_batch_size", lambda v: 1 <= v <= BATCH_MAX, f"in [1, {BATCH_MAX}]"),
    ("data.global_batch_size", lambda v: v >= 0, ">= 0 (0: world size x data.batch_size)"),
    ("autobatch.probe_sizes", lambda v: all(s >= 1 for s in v), "a list of sizes >= 1"),
    ("autobatch.probe_steps", lambda v: v >= 1, ">= 1"),
    ("autobatch.cpu_memory_mb", lambda v: v >= 0, ">= 0 (0: no cap)"),
    ("autobatch.cuda_memory_fraction", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("data.num_workers", lambda v: 0 <= v <= WORKERS_MAX, f"in [0, {WORKERS_MAX}] (0: load in the main process)"),
    ("data.test_fraction", lambda v: 0 < v < 1, "between 0 and 1"),
    ("data.split_seed", lambda v: 0 <= v <= SEED_MAX, f"in [0, {SEED_MAX}]"),
    ("data.image_size", lambda v: v >= 1, ">= 1"),
    ("data.num_classes", lambda v: v >= 2, ">= 2"),
    ("data.train_size", lambda v: v >= 1, ">= 1"),
    ("data.test_size", lambda v: v >= 1, ">= 1"),
    ("data.num_points", lambda v: v >= 1, ">= 1"),
    ("optim.lr", lambda v: v > 0, "> 0"),
    ("optim.momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optim.weight_decay", lambda v: v >= 0, ">= 0"),
    ("optim.grad_clip", lambda v: v >= 0, ">= 0 (0: no clipping)"),
    ("optim.accum_steps", lambda v: v >= 1, ">= 1"),
    ("schedule.warmup_epochs", lambda v: v >= 0, ">= 0"),
    ("schedule.step_epochs", lambda v: v >= 1, ">= 1"),
    ("schedule.gamma", lambda v: v > 0, "> 0"),
    ("schedule.min_lr", lambda v: v >= 0, ">= 0"),
    ("checkpoint.every_steps", lambda v: v >= 0, ">= 0 (0: only at epoch ends)"),
    ("checkpoint.keep_last", lambda v: v >= 1, ">= 1"),
    ("log.progress_seconds", lambda v: v >= 0, ">= 0"),
    ("perf.every_steps", lambda v: v >= 1, ">= 1"),
    ("perf.comm_probe_steps", lambda v: v >= 0, ">= 0 (0: no probe)"),
    ("dist.timeout", lambda v: 0 < v <= PG_TIMEOUT_MAX_S, f"in (0, {PG_TIMEOUT_MAX_S}] seconds"),
    ("comm.powersgd_rank", lambda v: v >= 1, ">= 1"),
    ("comm.start_iter", lambda v: v > 1, "> 1 (torch's PowerSGD needs start_powerSGD_iter > 1)"),
    ("comm.localsgd_period", lambda v: v >= 1, ">= 1"),
    ("comm.bucket_cap_mb", lambda v: 0 < v <= BUCKET_CAP_MAX_MB, f"in (0, {BUCKET_CAP_MAX_MB}] MiB"),
    ("comm.diloco_inner_steps", lambda v: v >= 1, ">= 1"),
    ("comm.diloco_outer_lr", lambda v: v > 0, "> 0"),
    ("comm.diloco_outer_momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("debug.stop_after_epoch", lambda v: v >= 0, ">= 0 (0: never)"),
    ("debug.stop_after_step", lambda v: v >= 0, ">= 0 (0: never)"),
    ("debug.step_sleep_seconds", lambda v: 0 <= v <= 60, "in [0, 60]"),
)


def check_ranges(cfg: Any, source: str) -> None:
    for key, ok, allowed in RANGES:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if not ok(value):
            raise UsageError(f"{source}: {key!r} must be {allowed}; got {shown(value)}")
    check_combinations(cfg, source)


def shown(value: object) -> str:
    """`value` as repr writes it (escaped, text in quotes), at most SHOWN_MAX characters: reprlib stops
    early in a long list or text, so a value of millions of items costs nothing to show."""
    if isinstance(value, int) and value.bit_length() > 13_000:  # repr() refuses ints past 4300 digits
        return "a number of thousands of digits"
    short = reprlib.Repr()
    short.maxstring = short.maxlong = short.maxother = SHOWN_MAX - 20  # room for the brackets around one
    short.maxlist = short.maxtuple = short.maxdict = 8
    text = short.repr(value)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX - 1] + "…"


def check_combinations(cfg: Any, source: str) -> None:
    """DiLoCo's inner steps communicate nothing (docs/sites.md); SyncBatchNorm would all-gather
    every BatchNorm layer's statistics over every rank at each of them, across the slow links."""
    hook = cfg.comm.hook
    if cfg.sync_bn and hook in (CommHook.DILOCO, CommHook.DILOCO_OVERLAP):
        raise UsageError(f"{source}: 'sync_bn' true and 'comm.hook' {hook.value} do not go together: "
                         f"SyncBatchNorm would communicate at every inner step; set sync_bn=false "
                         f"(the outer step averages BatchNorm statistics) or use comm.hook=hier "
                         f"(SyncBatchNorm inside each site)")
