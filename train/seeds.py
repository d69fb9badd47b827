"""The run's random streams, each seeded from (run seed, role, rank, ...) by a hash.

Contract: ``derive(seed, role, *parts)`` is a 63-bit generator seed, a pure function of its
arguments, the same on every host and Python run (blake2b, not Python's salted ``hash``).
Different (seed, role, parts) give unrelated seeds: sums such as ``seed + 1 + rank`` made rank
1 of seed 0, rank 0 of seed 1 and the initial weights of seed 2 one stream, so a seed sweep's
runs shared their dropout and augmentation draws.
"""

from __future__ import annotations

import hashlib

INIT = "init"  # the initial weights: the same on every rank
RANK = "rank"  # a rank's dropout/augmentation stream from the start of a run
RESUME = "resume"  # that stream re-derived at a resume on another world size (with the step)
LOADER = "loader"  # the DataLoader's generator (worker seeds), per epoch and position
ROLES = (INIT, RANK, RESUME, LOADER)


def derive(seed: int, role: str, *parts: int) -> int:
    """The seed of stream ``role`` of run seed ``seed``; ``parts`` (rank, step, ...) in a fixed
    order per role. 63 bits: every torch generator takes it, and it is never negative."""
    assert role in ROLES, f"unknown random stream {role!r}"
    text = ":".join(["meshrun", role, str(seed), *(str(int(p)) for p in parts)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
