"""A stand-in for `meshrun.fsutil`'s hashlib that counts the bytes every sha256 digests: where each
digest meshrun makes of a file is made (tests/test_fetch_hash_passes.py, bench/refetch.py)."""

from __future__ import annotations

import hashlib


class CountingHashlib:
    """hashlib, but every sha256 adds the bytes it digests to `hashed`."""

    def __init__(self) -> None:
        self.hashed = 0

    def sha256(self, data: bytes = b"") -> object:
        counter, real = self, hashlib.sha256(data)
        counter.hashed += len(data)

        class Sha:
            def update(self, block: bytes) -> None:
                counter.hashed += len(block)
                real.update(block)

            def hexdigest(self) -> str:
                return real.hexdigest()

        return Sha()
