"""The closed sets of choices a trainer config field can take (`train/config.py` holds the
dataclasses that use them). Values are what users write in YAML and `key=value` overrides."""

from __future__ import annotations

import enum


class ModelKind(str, enum.Enum):
    MLP = "mlp"
    TOY = "toy"
    TORCHVISION = "torchvision"
    POINTNET2 = "pointnet2"


class DatasetKind(str, enum.Enum):
    DIGITS = "digits"
    CIFAR10 = "cifar10"
    IMAGEFOLDER = "imagefolder"
    SYNTHETIC_IMAGES = "synthetic_images"
    SHAPES = "shapes"
    MODELNET40 = "modelnet40"


class OptimizerKind(str, enum.Enum):
    SGD = "sgd"
    ADAMW = "adamw"


class ScheduleKind(str, enum.Enum):
    CONSTANT = "constant"
    STEP = "step"
    COSINE = "cosine"


class Precision(str, enum.Enum):
    OFF = "off"
    BF16 = "bf16"
    FP16 = "fp16"


class WireDtype(str, enum.Enum):
    """The pseudo-gradient's dtype on the wire (DiLoCo's outer all-reduce; hier: between sites)."""

    FP32 = "fp32"
    BF16 = "bf16"  # half the bytes; the sample weights and float buffers stay fp32


class Backend(str, enum.Enum):
    AUTO = "auto"
    GLOO = "gloo"
    NCCL = "nccl"


class CommHook(str, enum.Enum):
    """Gradient communication: torch's own DDP comm hooks (see ``train.comm``)."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    LOCALSGD = "localsgd"
    DILOCO = "diloco"  # H local steps, then an outer Nesterov step (train.diloco)
    DILOCO_OVERLAP = "diloco-overlap"  # the same, outer all-reduce hidden behind the next round
    HIER = "hier"  # DDP inside each site, diloco-overlap between sites (train.sites, docs/sites.md)
