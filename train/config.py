"""Typed training configuration: frozen dataclasses built from YAML plus ``key=value`` overrides.

Contract:
- ``load_config(path, overrides)`` returns a fully validated ``TrainConfig`` or raises
  ``UsageError`` whose message is one line naming the source (file or override), the dotted key,
  what is allowed and, for typos, a did-you-mean.
- Only ``train.__main__`` calls it; everything else receives the sub-config it needs.
- The YAML, a file's and each override's value, is composed by ``config_rules.YamlLoader``: nesting and
  alias expansion bounded, a duplicate key refused, each as one line with the file's line and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from meshrun.fsutil import read_regular
from meshrun.layout import DEFAULT_PG_TIMEOUT_S
from meshrun.train.kinds import (Backend, CommHook, DatasetKind, ModelKind, OptimizerKind,  # noqa: F401 - re-exported
                         Precision, ScheduleKind, WireDtype)
from meshrun.train.config_rules import (DECIMAL_FLOAT, DECIMAL_INT, SHOWN_MAX, Refused, YamlLoader,
                                        check_ranges, shown)
from meshrun.train.errors import UsageError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "digits.yaml"
CONFIG_MAX = 1 << 20  # a config is a page of YAML; read as a regular file of at most this many bytes


@dataclass(frozen=True)
class ModelConfig:
    """Which network to build; fields a model does not use are ignored by it."""

    name: ModelKind = ModelKind.MLP
    arch: str = "resnet18"  # any torchvision.models constructor name
    small_stem: bool = False  # 3x3 stride-1 stem without max-pool, for 32x32 inputs
    hidden: tuple[int, ...] = (128, 64)  # MLP hidden widths
    dropout: float = 0.0
    sa_points: tuple[int, ...] = (256, 64)  # PointNet++ centroids per set-abstraction level
    sa_radius: tuple[float, ...] = (0.2, 0.4)
    sa_samples: int = 32  # neighbours per ball query
    width: int = 64  # PointNet++ base channel width


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from and how they are batched. ``batch_size`` is per process unless
    the host's inventory sets its own; ``global_batch_size`` is what ``batch_size: auto`` ranks
    share (0: world size x ``batch_size``), see ``train.balance``."""

    name: DatasetKind = DatasetKind.DIGITS
    root: str = ""
    batch_size: int = 32
    global_batch_size: int = 0
    eval_batch_size: int = 256
    num_workers: int = 0
    test_fraction: float = 0.2  # digits: held-out share, split with a fixed seed
    split_seed: int = 0
    image_size: int = 32  # synthetic images / ImageFolder crop
    num_classes: int = 10  # synthetic images / shapes
    train_size: int = 2000  # generated datasets
    test_size: int = 500
    num_points: int = 512  # point clouds
    augment: bool = True


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer, gradient accumulation and clipping (``grad_clip`` 0 disables clipping)."""

    name: OptimizerKind = OptimizerKind.SGD
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    grad_clip: float = 0.0
    accum_steps: int = 1


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning rate as a function of fractional epoch; see ``train.optim.lr_at``."""

    name: ScheduleKind = ScheduleKind.CONSTANT
    warmup_epochs: float = 0.0
    step_epochs: int = 30  # STEP: multiply by gamma every this many epochs (seed 004)
    gamma: float = 0.1
    min_lr: float = 0.0


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0  # also save every N optimizer steps; 0 = only at epoch ends
    keep_last: int = 3
    resume: bool = True


@dataclass(frozen=True)
class DistConfig:
    backend: Backend = Backend.AUTO
    timeout: float = float(DEFAULT_PG_TIMEOUT_S)  # seconds, passed to init_process_group


@dataclass(frozen=True)
class CommConfig:
    """DDP gradient communication; see ``train.comm`` and docs/performance.md."""

    hook: CommHook = CommHook.NONE
    powersgd_rank: int = 4  # PowerSGD matrix approximation rank r: sends (m+n)r, not mn
    start_iter: int = 10  # powersgd/localsgd: plain all-reduce for the first iterations (> 1)
    localsgd_period: int = 4  # localsgd: average parameters every this many optimizer steps
    bucket_cap_mb: float = 25.0  # DDP bucket size; bigger buckets pay link latency fewer times
    diloco_inner_steps: int = 8  # diloco: H, inner optimizer steps per round (docs/performance.md)
    diloco_outer_lr: float = 0.7  # Douillard et al. 2023
    diloco_outer_momentum: float = 0.9
    diloco_nesterov: bool = True
    diloco_wire_dtype: WireDtype = WireDtype.FP32  # bf16: the pseudo-gradient crosses in half the bytes


@dataclass(frozen=True)
class LogConfig:
    print_every_steps: int = 50
    progress_seconds: float = 2.0
    tensorboard: bool = True
    wandb: bool = False  # also to Weights & Biases, offline unless WANDB_MODE says (train/wandblog.py)
    wandb_project: str = ""  # "": WANDB_PROJECT, else wandb's default


@dataclass(frozen=True)
class PerfConfig:
    every_steps: int = 20  # one per-rank step record aggregates this many optimizer steps
    comm_probe_steps: int = 3  # steps timed with and without gradient sync; 0 disables


@dataclass(frozen=True)
class AutoBatchConfig:
    """The ``batch_size: auto`` probe (``train.balance``)."""

    probe_sizes: tuple[int, ...] = ()  # empty: share/2, share, 2 x share (share = global/world)
    probe_steps: int = 3  # timed forward+backward passes per size, after one warm-up pass
    cpu_memory_mb: float = 0.0  # CPU cap per process (activations + 4x parameters); 0: none
    cuda_memory_fraction: float = 0.9  # CUDA cap: this share of the device's memory


@dataclass(frozen=True)
class DebugConfig:
    """Fault injection for tests: exit with status 3 right after the named checkpoint; or make every
    optimizer step a slow device's (sleep this long after it: wall time, no CPU), so that a run
    lasts long enough for what a test does meanwhile, however fast the machine."""

    stop_after_epoch: int = 0
    stop_after_step: int = 0
    step_sleep_seconds: float = 0.0


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    epochs: int = 20
    amp: Precision = Precision.OFF
    sync_bn: bool = False  # BatchNorm -> SyncBatchNorm (statistics over all ranks' samples; CUDA)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    log: LogConfig = field(default_factory=LogConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    autobatch: AutoBatchConfig = field(default_factory=AutoBatchConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


def load_config(path: Path | None = None, overrides: tuple[str, ...] = ()) -> TrainConfig:
    """YAML file (default: packaged digits.yaml) with dotted ``key=value`` overrides applied. A
    bare name that is no file here but one of the shipped configs (``cifar10_toy.yaml``) means
    that one, so a user project can name them without copying them in."""
    path = DEFAULT_CONFIG if path is None else path
    if path.name == str(path) and not os.path.lexists(path) and (CONFIG_DIR / path.name).is_file():
        path = CONFIG_DIR / path.name
    try:
        text = read_regular(path, CONFIG_MAX).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {path} not found; ship-in configs: {_shipped()}") from None
    except (OSError, UnicodeDecodeError) as err:  # a FIFO, a device, too large, a name too long, not UTF-8
        raise UsageError(f"config file {path}: cannot be read ({err}); name a YAML file") from None
    try:
        raw = yaml.load(text, Loader=YamlLoader) or {}
    except Refused as err:
        raise UsageError(f"{path}:{err.line}: {err.problem}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:  # ValueError: e.g. `!!int` of 5000 digits
        raise UsageError(f"config file {path} is not valid YAML: {_one_line(err)}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: top level must be a mapping of keys, got {type(raw).__name__}")
    cfg = _build(TrainConfig, raw, "", str(path))
    for item in overrides:
        cfg = apply_override(cfg, item)
    check_ranges(cfg, f"{path} with overrides" if overrides else str(path))
    return cfg


def apply_override(cfg: TrainConfig, item: str) -> TrainConfig:
    """Return ``cfg`` with one ``dotted.key=value`` override applied (value parsed as YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UsageError(f"override {shown(item)} must look like key=value, e.g. optim.lr=0.05")
    source = f"override {shown(item)}"
    try:
        value = yaml.load(text, Loader=YamlLoader) if text else ""
    except Refused as err:
        raise UsageError(f"{source}: {err.problem}") from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply; a config needs 4 levels") from None
    except (yaml.YAMLError, ValueError):  # not YAML: the text itself, which a number key refuses
        value = text
    return _replace_path(cfg, key.split("."), value, "", source, text)


def to_dict(cfg: Any) -> Any:
    """Plain JSON/YAML-able form of a config (enums as values, tuples as lists)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, tuple):
        return [to_dict(v) for v in cfg]
    return cfg


def _shipped() -> str:
    return ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.yaml")))


def _one_line(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__  # PyYAML quotes the input: clip it
    return text if len(text) <= 3 * SHOWN_MAX else text[:3 * SHOWN_MAX - 1] + "…"


def _build(cls: type, raw: Mapping[str, Any], prefix: str, source: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            _unknown(cls, prefix, key if isinstance(key, str) else shown(key), source)
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(hints[name], raw[name], prefix + name, source, None)
    return cls(**kwargs)


def _replace_path(obj: Any, parts: list[str], value: Any, prefix: str, source: str,
                  text: str) -> Any:
    head, rest = parts[0], parts[1:]
    hints = typing.get_type_hints(type(obj))
    if head not in hints:
        _unknown(type(obj), prefix, ".".join(parts), source)
    kind = hints[head]
    if dataclasses.is_dataclass(kind):
        if not rest:
            raise UsageError(f"{source}: {prefix + head!r} is a section; set one of its keys, "
                             f"e.g. {prefix + head}.{dataclasses.fields(kind)[0].name}=...")
        new = _replace_path(getattr(obj, head), rest, value, prefix + head + ".", source, text)
    elif rest:
        _unknown(type(obj), prefix, ".".join(parts), source)
    else:
        new = _coerce(kind, value, prefix + head, source, text)
    return dataclasses.replace(obj, **{head: new})


def _unknown(cls: type, prefix: str, key: str, source: str) -> typing.NoReturn:
    full = prefix + key
    allowed = sorted(f.name for f in dataclasses.fields(cls))
    guess = difflib.get_close_matches(full[:100], _all_keys(TrainConfig, ""), n=1, cutoff=0.6)
    if not guess:
        tail = full.rsplit(".", 1)[-1]
        guess = [k for k in _all_keys(TrainConfig, "") if k.rsplit(".", 1)[-1] == tail][:1]
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    where = f"under {prefix[:-1]!r}" if prefix else "at top level"
    raise UsageError(f"{source}: unknown key {shown(full)}{hint}; allowed {where}: {', '.join(allowed)}")


def _all_keys(cls: type, prefix: str) -> list[str]:
    keys = []
    for name, kind in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(kind):
            keys += _all_keys(kind, prefix + name + ".")
        else:
            keys.append(prefix + name)
    return keys


def _coerce(kind: Any, value: Any, key: str, source: str, text: str | None) -> Any:
    """Check/convert one leaf value; ``text`` is the raw override text (None for YAML files)."""
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise UsageError(f"{source}: {key!r} must be a mapping of keys, got {shown(value)}")
        return _build(kind, value, key + ".", source)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = [m.value for m in kind]
        if isinstance(value, bool):  # YAML 1.1 reads `amp: off` (and `amp=off`) as false
            value = text if text is not None else ("on" if value else "off")
        if value in choices:
            return kind(value)
        guess = difflib.get_close_matches(value[:100] if isinstance(value, str) else shown(value), choices, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise UsageError(f"{source}: {key!r} must be one of {', '.join(choices)}; "
                         f"got {shown(value)}{hint}")
    if typing.get_origin(kind) is tuple:
        return _coerce_tuple(typing.get_args(kind)[0], value, key, source)
    return _coerce_scalar(kind, value, key, source, text)


def _coerce_tuple(item: type, value: Any, key: str, source: str) -> tuple:
    values = value if isinstance(value, list) else [value]
    try:
        return tuple(_coerce_scalar(item, v, key, source, None) for v in values)
    except UsageError:
        raise UsageError(f"{source}: {key!r} must be a list of {item.__name__}s like [1, 2]; "
                         f"got {shown(value)}") from None


def _coerce_scalar(kind: type, value: Any, key: str, source: str, text: str | None) -> Any:
    if kind is str:
        if isinstance(value, str):
            return value
        if text is not None:
            return text  # an override value is a string by nature, e.g. data.root=2024
    elif kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        number = _finite(value)
        if number is not None:
            return number
    else:
        raise AssertionError(f"unsupported config field type {kind!r} for {key}")
    names = {str: "a string", bool: "true or false", int: "an integer", float: "a finite number"}
    raise UsageError(f"{source}: {key!r} must be {names[kind]}; got {shown(text if text is not None else value)}")


def _finite(value: Any) -> float | None:
    """A number, or the text of a decimal one (quoted in a file: '0.1'), as a finite float; else None."""
    if isinstance(value, str) and (re.fullmatch(DECIMAL_FLOAT, value) or re.fullmatch(DECIMAL_INT, value)):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return number if math.isfinite(number) else None
