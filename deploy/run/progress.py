"""The trainer's `progress.json` as a host's agent reports it (`status`'s `progress`), pure: its
fields shape-checked one by one, and what `fab status --watch` makes of two of them: samples/s
now (between two answers) and on average (since this start of the worker group), each host's
share of them, and the run's ETA.

Only rank 0's host has the file (train/metrics.py writes it every `log.progress_seconds`); the
watch takes the newest answer that holds one. A data-parallel world steps together, so a host's
samples/s is the world's times its ranks' share of the global batch, and its last progress is
the world's. A field of the wrong shape is dropped (the cell shows `-`), never an exception: the
answer comes from a host, and an older trainer writes fewer fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.deploy.run.answers import is_int, is_real

BIG = 2**53  # counts a float still holds exactly
HOSTS_LIMIT = 1024  # hosts read from host_batches
RANKS_LIMIT = 4096  # batch sizes read, over all hosts
NAME_LIMIT = 100


@dataclass(frozen=True)
class Progress:
    epoch: int  # 0-based epoch in progress (the epochs done at an epoch's end)
    step_in_epoch: int
    steps_per_epoch: int
    global_step: int
    world_size: int
    time: float  # the trainer's clock on rank 0's host
    samples_seen: int | None = None  # None: an older trainer
    epochs: int | None = None
    restarts: int | None = None
    host_batches: tuple[tuple[str, tuple[int, ...]], ...] = ()
    since: tuple[float, int, int] | None = None  # this start's first record: time, global_step, samples_seen
    age_s: float | None = None  # how old it was when its host answered (the host's own clock both times)


def _count(value: object) -> int | None:
    return value if is_int(value) and 0 <= value < BIG else None  # type: ignore[operator,return-value]


def _time(value: object) -> float | None:
    return float(value) if is_real(value) and 0 <= value < 1e11 else None  # type: ignore[arg-type,operator]


def _host_batches(value: object) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if not (isinstance(value, dict) and len(value) <= HOSTS_LIMIT):
        return ()
    found, ranks = [], 0
    for host, sizes in value.items():
        if not (isinstance(sizes, list) and 0 < len(sizes) and all(is_int(s) and 0 < s < 2**31 for s in sizes)):
            return ()
        ranks += len(sizes)
        if len(host) > NAME_LIMIT or ranks > RANKS_LIMIT:
            return ()
        found.append((host, tuple(sizes)))
    return tuple(found)


def _since(value: object) -> tuple[float, int, int] | None:
    if not (isinstance(value, list) and len(value) == 3):
        return None
    at, step, samples = _time(value[0]), _count(value[1]), _count(value[2])
    return None if at is None or step is None or samples is None else (at, step, samples)


def parse_progress(raw: object, now: object = None) -> Progress | None:
    """`status`'s `progress` object, or None when it is missing or its core fields are not sound;
    `now`: the answering agent's clock."""
    if not isinstance(raw, dict):
        return None
    core = [_count(raw.get(k)) for k in ("epoch", "step_in_epoch", "steps_per_epoch", "global_step", "world_size")]
    at = _time(raw.get("time"))
    if at is None or any(c is None for c in core):
        return None
    epoch, in_epoch, per_epoch, step, world = core
    return Progress(epoch, in_epoch, per_epoch, step, world, at, _count(raw.get("samples_seen")),  # type: ignore[arg-type]
                    _count(raw.get("epochs")), _count(raw.get("restarts")), _host_batches(raw.get("host_batches")),
                    _since(raw.get("since")), max(0.0, now - at) if (now := _time(now)) is not None else None)


def rate(before: Progress | None, now: Progress) -> float | None:
    """Samples/s of the world between two answers of the same start; None when they cannot tell."""
    if before is None or before.since != now.since or now.samples_seen is None or before.samples_seen is None:
        return None
    elapsed, done = now.time - before.time, now.samples_seen - before.samples_seen
    return done / elapsed if elapsed > 0 and done >= 0 else None


def average(now: Progress) -> float | None:
    """Samples/s of the world since this start's first record."""
    if now.since is None or now.samples_seen is None:
        return None
    elapsed, done = now.time - now.since[0], now.samples_seen - now.since[2]
    return done / elapsed if elapsed > 0 and done >= 0 else None


def share(now: Progress, host: str) -> float | None:
    """The part of the global batch `host`'s ranks take (0 for a host outside the world)."""
    total = sum(sum(sizes) for _, sizes in now.host_batches)
    return sum(sum(sizes) for name, sizes in now.host_batches if name == host) / total if total else None


def ranks(now: Progress, host: str) -> int | None:
    if not now.host_batches:
        return None
    return sum(len(sizes) for name, sizes in now.host_batches if name == host)


def eta_s(now: Progress) -> float | None:
    """Seconds left at this start's average step rate (evaluation included); 0 once done."""
    if now.epochs is None or now.since is None or now.epochs == 0:
        return None
    left = max(0, (now.epochs - now.epoch) * now.steps_per_epoch - now.step_in_epoch)
    if left == 0:
        return 0.0
    elapsed, steps = now.time - now.since[0], now.global_step - now.since[1]
    return left * elapsed / steps if elapsed > 0 and steps > 0 else None
