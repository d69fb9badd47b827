"""Loading checkpoint bytes without running code from them.

Contract: ``load_bytes``/``load_file`` unpickle with ``torch.load(weights_only=True)`` and an
allow-list of exactly the non-tensor classes the trainer saves, scoped to the call (the rest of
the process keeps torch's default list). Any failure raises ``UnsafeCheckpoint``.

A checkpoint is code until proven otherwise: a pickle's ``__reduce__`` runs on load, and the
manifest cannot vouch for a file because whoever could plant the file could rewrite the
manifest too. The only trainer state that is not tensors and plain containers is the numpy
``RandomState`` inside PowerSGD's state (``PowerSGDState.rng``), so the list is numpy's own
pickling helpers for it. None of them can reach code outside the list: the unpickler resolves
every global against the list, so the "constructor" arguments these helpers call can only be
other listed, harmless callables.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from numpy.random import _pickle as np_random_pickle
from numpy.random._mt19937 import MT19937

SAFE_GLOBALS: list[Any] = [
    np.random.RandomState,  # PowerSGDState.rng (its legacy pickling form follows)
    np_random_pickle.__randomstate_ctor,
    np_random_pickle.__bit_generator_ctor,
    MT19937,
    np._core.multiarray._reconstruct,  # the bit generator's uint32 key array
    np.ndarray,
    np.dtype,
    np.dtypes.UInt32DType,
]


class UnsafeCheckpoint(Exception):
    """The bytes are not a checkpoint the trainer could have written (or are damaged)."""


def load_bytes(payload: bytes) -> dict[str, Any]:
    return _load(io.BytesIO(payload))


def load_file(path: Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        return _load(handle)


def _load(source: BinaryIO) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            state = torch.load(source, map_location="cpu", weights_only=True)
    # Deliberately broad: hostile or damaged bytes can make torch's zip reader, the restricted
    # unpickler or a listed constructor raise almost any type, and every one means "skip it".
    except Exception as err:  # noqa: BLE001
        raise UnsafeCheckpoint(_first_line(err)) from None
    if not isinstance(state, dict):
        raise UnsafeCheckpoint(f"holds a {type(state).__name__}, not a checkpoint dictionary")
    return state


def _first_line(err: Exception) -> str:
    """torch's weights-only errors run to a dozen lines of advice; keep the reason."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    fallback = lines[-1] if lines else ""
    reason = next((ln for ln in lines if "WeightsUnpickler error:" in ln), fallback)
    reason = reason.replace("WeightsUnpickler error: ", "").split(" Please use", 1)[0]
    return f"{type(err).__name__}: {reason}"[:300]


__all__ = ["SAFE_GLOBALS", "UnsafeCheckpoint", "load_bytes", "load_file"]
