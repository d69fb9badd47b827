"""Checkpoint files: atomic rank-0 writes, retention, sha256 manifest, and agreed resume.

Layout of ``<run dir>/checkpoints/``:
- ``ckpt-step<global step, 9 digits>.pt``: the newest ``keep_last`` saves;
- ``best.pt``: a copy of the save with the best test accuracy so far (seed 004's model_best);
- ``MANIFEST.sha256``: ``"<sha256>  <filename>"`` lines (``sha256sum -c`` format) for all of them.

Resume does not assume shared storage: every rank reports the newest valid checkpoint on its own
host, all take the maximum step, and the lowest rank holding it broadcasts the bytes.
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from train import dist
from train.config import CheckpointConfig
from common.fsutil import atomic_write_bytes, atomic_writer, sha256_file

MANIFEST = "MANIFEST.sha256"
BEST = "best.pt"
_NAME = re.compile(r"^ckpt-step(\d{9})\.pt$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-step{step:09d}.pt"


class Checkpointer:
    """Saves (call only on rank 0) and finds checkpoints in one local directory."""

    def __init__(self, directory: Path, cfg: CheckpointConfig) -> None:
        self.directory = directory
        self.cfg = cfg
        self.hashes = read_manifest(directory / MANIFEST)

    def due(self, global_step: int) -> bool:
        """Whether an intra-epoch save is due after this optimizer step."""
        return self.cfg.every_steps > 0 and global_step % self.cfg.every_steps == 0

    def save(self, state: dict[str, Any], step: int, is_best: bool) -> Path:
        """Write ``state`` as the checkpoint for ``step``; the previous files stay valid until the
        new one is complete, so a crash at any point leaves a loadable newest checkpoint."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / checkpoint_name(step)
        with atomic_writer(path) as out:
            torch.save(state, out)
        self.hashes[path.name] = out.sha.hexdigest()
        if is_best:
            self._copy_best(path)
        self._prune()
        self._write_manifest()
        return path

    def _copy_best(self, path: Path) -> None:
        with atomic_writer(self.directory / BEST) as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
        self.hashes[BEST] = out.sha.hexdigest()

    def _prune(self) -> None:
        steps = sorted(self.local_steps())
        for step in steps[:-self.cfg.keep_last] if self.cfg.keep_last > 0 else []:
            name = checkpoint_name(step)
            (self.directory / name).unlink(missing_ok=True)
            self.hashes.pop(name, None)

    def _write_manifest(self) -> None:
        present = {n: h for n, h in self.hashes.items() if (self.directory / n).exists()}
        lines = "".join(f"{h}  {n}\n" for n, h in sorted(present.items()))
        atomic_write_bytes(self.directory / MANIFEST, lines.encode())

    def local_steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return [int(m.group(1)) for m in found if m]

    def newest_valid(self) -> int:
        """Newest step on this host whose bytes match the manifest (a file written after the
        last manifest update is trusted: the atomic rename guarantees it is complete); -1 if
        none."""
        for step in sorted(self.local_steps(), reverse=True):
            name = checkpoint_name(step)
            expected = self.hashes.get(name)
            if expected is None or sha256_file(self.directory / name) == expected:
                return step
        return -1

    def read_bytes(self, step: int) -> bytes:
        return (self.directory / checkpoint_name(step)).read_bytes()


def read_manifest(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.split("  ", 1) for line in path.read_text().splitlines() if line.strip())
    return {name: digest for digest, name in pairs}


def restore_agreed(ckpt: Checkpointer, rank: int, device: torch.device) -> dict[str, Any] | None:
    """Collective over all ranks: the newest checkpoint held by any rank, loaded on every rank
    (None when no rank has one). Every rank reaches the same decision because it is computed
    from the same all-gathered list."""
    steps = dist.all_gather_ints(ckpt.newest_valid(), device)
    newest = max(steps)
    if newest < 0:
        return None
    src = steps.index(newest)
    payload = dist.broadcast_bytes(ckpt.read_bytes(newest) if rank == src else None, src, device)
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    state["restored_from_rank"] = src
    return state


def load_file(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)
