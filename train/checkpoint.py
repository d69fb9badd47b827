"""Checkpoint files: one complete copy per host, retention, sha256 manifest, and agreed resume.

Layout of ``<run dir>/checkpoints/`` on every host:
- ``ckpt-step<global step, 9 digits>.pt``: the newest ``keep_last`` saves;
- ``best.pt``: a copy of the save with the best test accuracy so far (seed 004's model_best);
- ``MANIFEST.sha256``: ``"<sha256>  <filename>"`` lines (``sha256sum -c`` format) for all of them.

Writers: ``open_site`` (collective, once) elects the lowest rank that sees each directory, so a
host's ranks, or several "hosts" sharing one filesystem, get one writer per directory. Every
writer saves the same state (per-rank state is all-gathered by ``train.state`` and
``train.comm``), and ``save`` compares the writers' sha256 so the copies are byte-identical:
a writer whose bytes differ from rank 0's stores rank 0's bytes instead (one broadcast).

Resume does not assume shared storage and trusts no file: a rank offers only files named like
the trainer's and listed in its manifest with a matching hash; all ranks take the newest
offered step; a rank holding the lowest holder's copy (same hash) reads its own, the others
receive that holder's bytes; every rank checks them against that hash and loads them with
``train.safe_load`` (no code runs). If any rank fails to, all ranks drop that copy and try the
next newest, down to a fresh start (``restore_agreed``).
"""

from __future__ import annotations

import hashlib
import io
import re
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as torch_dist

from meshrun.train import dist
from meshrun.train.config import CheckpointConfig
from meshrun.train.safe_load import UnsafeCheckpoint, load_bytes, load_file
from meshrun.train.staletemps import remove_stale_temps
from meshrun.fsutil import atomic_write_bytes, sha256_file
from meshrun.layout import (BEST_CHECKPOINT, CHECKPOINT_MANIFEST, checkpoint_name, checkpoint_step,  # noqa: F401
                           is_checkpoint_name)

MANIFEST = CHECKPOINT_MANIFEST  # names shared with the controller's fetch (common/layout.py)
BEST = BEST_CHECKPOINT
PROBE_PREFIX = ".writer-probe-"
LABEL_MAX, NAMES_MAX = 4096, 1 << 20  # bytes a rank may send of a file's label, of a state's top-level names
LABEL_SHOWN = 512  # characters of another rank's label in a warning: a host and a path
REQUIRED = ("format", "model", "optimizer", "position", "rng", "world_size")  # see train.state
_MANIFEST_LINE = re.compile(r"([0-9a-f]{64})  (\S+)")

Warn = Callable[[str], None]


def warn_stderr(text: str) -> None:
    print(f"train: warning: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Site:
    """This rank's part in the checkpoint directories of a run (see ``open_site``)."""

    rank: int
    host: str  # for messages: MESHRUN_HOST, else the hostname
    writer: bool  # this rank writes its directory
    writers: tuple[int, ...]  # every writer, ascending; rank 0 always writes
    device: torch.device  # for collectives (NCCL needs CUDA tensors)


def local_site(host: str = "") -> Site:
    """A single process: it writes its own directory."""
    return Site(0, host or socket.gethostname(), True, (0,), torch.device("cpu"))


def open_site(directory: Path, rank: int, host: str, device: torch.device) -> Site:
    """Collective: elect one writer per directory, the lowest rank that sees it. Ranks tell
    which directories are the same by seeing each other's probe files, which also holds for a
    filesystem shared between machines (where LOCAL_RANK would elect one writer per machine)."""
    directory.mkdir(parents=True, exist_ok=True)
    token = f"{dist.all_gather_ints(secrets.randbits(62), device)[0]:016x}"  # rank 0's: per run
    probe = directory / f"{PROBE_PREFIX}{token}-{rank}"
    probe.touch()
    dist.barrier()
    pattern = re.compile(re.escape(f"{PROBE_PREFIX}{token}-") + r"(\d+)")
    seen = [int(m.group(1)) for p in directory.iterdir() if (m := pattern.fullmatch(p.name))]
    dist.barrier()  # every rank has listed before any probe goes
    probe.unlink()
    flags = dist.all_gather_ints(int(min(seen) == rank), device)
    writers = tuple(r for r, flag in enumerate(flags) if flag)
    return Site(rank, host or socket.gethostname(), rank in writers, writers, device)


class Checkpointer:
    """Saves (collectively; writers write) and finds checkpoints in one local directory."""

    def __init__(self, directory: Path, cfg: CheckpointConfig, site: Site | None = None,
                 warn: Warn = warn_stderr) -> None:
        self.directory = directory
        self.cfg = cfg
        self.site = site or local_site()
        self.warn = warn
        if self.site.writer:  # the directory's one writer: saves an earlier group's kill cut short
            remove_stale_temps(directory)
        self.hashes = read_manifest(directory / MANIFEST)
        self._verified: dict[str, bool] = {}
        self._warned_divergence = False
        # resume=false: from step 0, so what is listed is another timeline's, unlisted by the first save.
        self._earlier = frozenset() if cfg.resume else frozenset(filter(is_checkpoint_name, self.hashes))
        if self._earlier and self.site.writer:  # one line per directory
            self.warn(f"checkpoint.resume is false but {self.label(MANIFEST)} lists an earlier session's "
                      f"checkpoints (steps {_steps(self._earlier)}); this run starts from step 0 and its first save "
                      "supersedes them (unlisted, files left in place until a save of the same step replaces them)")

    def due(self, global_step: int) -> bool:
        """Whether an intra-epoch save is due after this optimizer step."""
        return self.cfg.every_steps > 0 and global_step % self.cfg.every_steps == 0

    def save(self, state: dict[str, Any] | None, step: int, is_best: bool) -> Path | None:
        """Collective: every rank calls, writers pass ``state`` (others None) and get the written
        path. The previous files stay valid until the new one is complete (a crash leaves one)."""
        buf = io.BytesIO()
        if self.site.writer:
            assert state is not None, "a writer must pass the state"
            torch.save(state, buf)
        payload = self._identical(buf.getvalue(), state)
        if not self.site.writer:
            return None
        return self._write(payload, step, is_best)

    def _identical(self, payload: bytes, state: dict[str, Any] | None) -> bytes:
        """Collective: the writers' bytes, made equal to rank 0's: one small all-gather (equal by construction);
        a difference (per-rank state a hook does not gather into its own per-rank record) costs a broadcast of rank 0's."""
        site = self.site
        if len(site.writers) < 2:
            return payload
        codes = dist.all_gather_ints(_short_digest(payload) if site.writer else 0, site.device)
        differ = [r for r in site.writers if codes[r] != codes[0]]
        if not differ:
            return payload
        if not self._warned_divergence:  # every rank knows: the same collectives follow
            self._warned_divergence = True
            keys = _differing_keys(state, site)
            if site.rank == 0:
                self.warn(f"checkpoint copies of ranks {differ} differ from rank 0's in {keys} "
                          "(state that differs per rank and is not gathered); they store rank "
                          "0's bytes, broadcast at every save")
        # A writer bounds rank 0's copy by its own; a rank that writes nothing has none to bound it by.
        theirs = dist.broadcast_bytes(payload if site.rank == 0 else None, 0, site.device,
                                      dist.size_limit(len(payload)) if site.writer else None)
        return theirs if site.rank in differ else payload

    def _write(self, payload: bytes, step: int, is_best: bool) -> Path:
        """The manifest never lists a file whose bytes are about to change or go (`best.pt`, a listed
        save of the same step, pruned saves are unlisted first), so a host killed at any point (or a
        fetch reading the manifest first) finds every listed file matching."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / checkpoint_name(step)
        if self.hashes.pop(path.name, None) is not None:  # a reused directory's, or a redone step's
            self._write_manifest()
        digest = atomic_write_bytes(path, payload)
        self._supersede(step)
        self.hashes[path.name] = digest
        if is_best:
            self.hashes.pop(BEST, None)
        pruned = self._prune(path.name)
        self._write_manifest()
        for name in pruned:
            (self.directory / name).unlink(missing_ok=True)
        if is_best:
            self.hashes[BEST] = atomic_write_bytes(self.directory / BEST, payload)
            self._write_manifest()
        return path

    def _supersede(self, step: int) -> None:
        """Unlists what this save makes another timeline's: on the first save with resume off, all
        the manifest listed at start; always, every listed step above `step` (a session not resumed,
        a newer copy `restore_agreed` fell back below), and `best.pt` if a copy of one. Listed, such
        a step would be the next resume's state and count toward `keep_last`, pruning this run's
        saves. Only unlisted, never deleted (the abandoned timeline's only copy): never offered,
        counted or pruned; a save of the same step replaces it. In the new save's manifest write,
        so a kill before it leaves the old listing whole."""
        stale = {n for n in self._earlier if n in self.hashes}
        self._earlier = frozenset()
        above = {n for n in self.hashes if (s := checkpoint_step(n)) is not None and s > step}
        if BEST in self.hashes and self.hashes[BEST] in {self.hashes[n] for n in above}:
            above.add(BEST)
        for name in stale | above:
            del self.hashes[name]
        if above - stale:
            self.warn(f"{self.label(MANIFEST)} listed steps {_steps(above - stale)} above this save "
                      f"(step {step}), from a timeline this run did not resume; unlisted (files "
                      "left in place), so resume and keep_last see this run's saves only")

    def _prune(self, saved: str) -> list[str]:
        """Unlists the saves past `keep_last`; returns their names, to delete once unlisted. Counts
        listed checkpoints only (none newer than `saved` after `_supersede`), never drops `saved`:
        an unlisted file (planted, or a save killed before its listing) is neither counted nor deleted."""
        steps = sorted(step for n in self.hashes if (step := checkpoint_step(n)) is not None)
        old = steps[:-self.cfg.keep_last] if self.cfg.keep_last > 0 else []
        pruned = [name for name in map(checkpoint_name, old) if name != saved]
        for name in pruned:
            self.hashes.pop(name, None)
        return pruned

    def _write_manifest(self) -> None:
        """Only the trainer's own files: a foreign line in the manifest read at start (a planted
        one) is not carried forward."""
        present = {n: h for n, h in self.hashes.items()
                   if is_checkpoint_name(n) and self._regular(n)}
        lines = "".join(f"{h}  {n}\n" for n, h in sorted(present.items()))
        atomic_write_bytes(self.directory / MANIFEST, lines.encode())

    def _regular(self, name: str) -> bool:
        return not (path := self.directory / name).is_symlink() and path.is_file()

    def local_steps(self) -> list[int]:
        """Steps of the regular files named exactly like the trainer's checkpoints."""
        if not self.directory.is_dir():
            return []
        found = ((checkpoint_step(p.name), p.name) for p in self.directory.iterdir())
        return [step for step, name in found if step is not None and self._regular(name)]

    def candidate(self, rejected: frozenset[int] = frozenset()) -> int:
        """Newest step not in ``rejected`` whose file the manifest lists with a matching hash; -1 if
        none. An unlisted file (a save cut short before its listing, or a planted one) is never offered."""
        for step in sorted(set(self.local_steps()) - rejected, reverse=True):
            if self._listed_and_intact(checkpoint_name(step)):
                return step
        return -1

    def newest_valid(self) -> int:
        return self.candidate()

    def _listed_and_intact(self, name: str) -> bool:
        if name not in self._verified:
            expected = self.hashes.get(name)
            ok = expected is not None and sha256_file(self.directory / name) == expected
            self._verified[name] = ok
            if not ok and self.site.writer:  # one warning per directory
                why = "is not listed in" if expected is None else "does not match"
                self.warn(f"checkpoint {self.label(name)} {why} {MANIFEST}; ignored")
        return self._verified[name]

    def label(self, name: str) -> str:
        """``host:path`` of a file here, for messages."""
        return f"{self.site.host}:{self.directory / name}"

    def read_bytes(self, step: int) -> bytes:
        return (self.directory / checkpoint_name(step)).read_bytes()

    def largest_local(self) -> int:
        """Bytes of the largest checkpoint here (0: none): bounds what another rank may send of one."""
        return max((self._size(checkpoint_name(step)) for step in self.local_steps()), default=0)

    def _size(self, name: str) -> int:
        try:
            return (self.directory / name).stat().st_size
        except OSError:
            return 0


def _differing_keys(state: dict[str, Any] | None, site: Site) -> list[str]:
    """Collective, for the divergence warning: rank 0's top-level entries that differ on some writer."""
    listed = "\n".join(sorted(state or {})).encode() if site.rank == 0 else None
    names = dist.broadcast_bytes(listed, 0, site.device, NAMES_MAX).decode().split("\n")
    differ = []
    for name in names:
        mine = 0
        if site.writer and state is not None and name in state:
            buf = io.BytesIO()
            torch.save(state[name], buf)
            mine = _short_digest(buf.getvalue())
        codes = dist.all_gather_ints(mine, site.device)
        if any(codes[r] != codes[0] for r in site.writers):
            differ.append(name)
    return differ


def peer_text(text: str, limit: int = LABEL_SHOWN) -> str:
    """Text another rank sent, as rank 0 prints it: non-printing characters (newline, ESC, bidi
    controls) escaped, so it stays on its line and cannot pass for a line of its own; clipped."""
    shown = text if text.isprintable() else repr(text)[1:-1]
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _steps(names: frozenset[str] | set[str]) -> list[int | str]:
    """For messages: the steps of checkpoint names, ascending, then `best.pt` if present."""
    steps: list[int | str] = sorted(s for n in names if (s := checkpoint_step(n)) is not None)
    return steps + [n for n in sorted(names) if checkpoint_step(n) is None]


def _short_digest(payload: bytes) -> int:
    """64 bits of sha256, as an int64 a tensor collective carries (equality check only)."""
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big", signed=True)


def read_manifest(path: Path) -> dict[str, str]:
    """{filename: sha256}; lines not in ``sha256sum`` format are ignored."""
    if not path.exists():
        return {}
    found = (_MANIFEST_LINE.fullmatch(line) for line in path.read_text().splitlines())
    return {m.group(2): m.group(1) for m in found if m}


def restore_agreed(ckpt: Checkpointer, rank: int, device: torch.device) -> dict[str, Any] | None:
    """Collective over all ranks: the newest checkpoint held by any rank that every rank loads
    safely, loaded on every rank (None when there is none). Each round is decided from all-gathered
    values, so all ranks take the same branch: a round whose bytes fail to load on any rank drops
    that copy everywhere (its holder, and every rank holding the same bytes) and the next round
    offers the next newest. A rank whose offers failed more often than an honest holder's could
    (`keep_last`) offers what it does not hold (re-offered forever, with every collective
    completing, it would hang the job) and is no longer heard, so the rounds end.
    Only tensor collectives are used: object collectives would unpickle peers' data."""
    rejected: set[int] = set()
    failures: dict[int, int] = {}  # source rank -> its offers that did not load; the same on every rank
    own = ckpt.largest_local()  # per-rank state (DiLoCo replicas, PowerSGD errors) grows with the world: x world size
    while True:
        offered = dist.all_gather_ints(ckpt.candidate(frozenset(rejected)), device)
        steps = [step if failures.get(r, 0) <= ckpt.cfg.keep_last else -1 for r, step in enumerate(offered)]
        newest = max(steps)
        if newest < 0:
            return None
        src = steps.index(newest)
        codes = _compare_copies(ckpt, steps, rank, device)
        needers = [r for r, step in enumerate(steps) if step != newest or codes[r] != codes[src]]  # lack src's copy
        payload = _agreed_bytes(ckpt, newest, src, needers, rank, device,
                                dist.size_limit(own * len(offered)) if own else None)
        digest = hashlib.sha256(payload).hexdigest()  # loaded only if the copy src listed (as `codes` carry it)
        state, reason = _try_load(payload) if int(digest[:15], 16) == codes[src] else \
            (None, "not the bytes its holder lists")
        loaded = dist.all_gather_ints(int(state is not None), device)
        if all(loaded):
            assert state is not None
            state["restored_from_rank"] = src
            return state
        name = checkpoint_name(newest)
        label = dist.broadcast_bytes(ckpt.label(name).encode() if rank == src else None, src,
                                     device, LABEL_MAX).decode(errors="replace")
        failures[src] = failures.get(src, 0) + 1
        if rank == 0:
            failed = [r for r, ok in enumerate(loaded) if not ok]
            # The label is its holder's word, the reason read from its bytes: both on one line (a newline
            # could forge a warning line, an ESC the terminal); the holder named by the rank rank 0 knows
            # sent them (a liar could name an honest host as the holder).
            holder = "" if src == rank else f"; rank {src} holds it and names it so"
            ckpt.warn(f"checkpoint {peer_text(label)} does not load safely on ranks {failed} "
                      f"({peer_text(reason) or 'see their logs'}){holder}; skipped, trying the next newest")
        if rank == src or ckpt.hashes.get(name) == digest:
            rejected.add(newest)


def _compare_copies(ckpt: Checkpointer, steps: list[int], rank: int, device: torch.device) -> list[int]:
    """Collective: every rank's 60-bit hash of the newest step (0: not offered); warns when holders
    disagree (hosts write identical copies: a tampered or foreign one). The lowest holder's is tried."""
    newest = max(steps)
    name = checkpoint_name(newest)
    mine = int(ckpt.hashes[name][:15], 16) if steps[rank] == newest else 0
    codes = dist.all_gather_ints(mine, device)
    groups: dict[int, list[int]] = {}
    for r in (r for r, step in enumerate(steps) if step == newest):
        groups.setdefault(codes[r], []).append(r)
    if len(groups) > 1 and rank == 0:
        ckpt.warn(f"copies of {name} differ between ranks {sorted(groups.values())} (tampered "
                  f"or foreign); trying rank {steps.index(newest)}'s")
    return codes


def _agreed_bytes(ckpt: Checkpointer, step: int, src: int, needers: list[int], rank: int,
                  device: torch.device, limit: int | None) -> bytes:
    """Collective between `src` and `needers` (all ranks derive both from all-gathered values: sends match receives);
    the others read their own copy, as 200 MB to every rank outlasts a 60 s timeout on a 20 Mbit link."""
    group, device = dist.object_channel() if needers else (None, device)  # as broadcast_bytes
    if rank in needers:
        size = torch.zeros(1, dtype=torch.int64, device=device)
        torch_dist.recv(size, src, group=group)
        dist.check_size(int(size.item()), limit, src)  # the sender's word: bounded before allocating
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        torch_dist.recv(buf, src, group=group)
        return buf.cpu().numpy().tobytes()
    payload = ckpt.read_bytes(step)
    if rank == src and needers:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        for peer in needers:
            torch_dist.send(torch.tensor([len(payload)], dtype=torch.int64, device=device), peer, group=group)
            torch_dist.send(buf, peer, group=group)
    return payload


def _try_load(payload: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        state = load_bytes(payload)
    except UnsafeCheckpoint as err:
        return None, str(err)
    missing = [key for key in REQUIRED if key not in state]
    return (None, f"not a trainer checkpoint: no {missing}") if missing else (state, "")


__all__ = ["MANIFEST", "BEST", "Site", "Checkpointer", "checkpoint_name", "local_site",
           "open_site", "peer_text", "read_manifest", "restore_agreed", "load_file", "warn_stderr"]
