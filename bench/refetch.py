"""A periodic `fab fetch-checkpoints` of a long run: the time each fetch takes once the bytes are on
this machine's side, as a multiple of one read of them.

One host, this machine (`address: local`, its own workdir: real rsync, no SSH, so the link costs
nothing and what is left is the controller's own reading, hashing and copying). The host holds what
the trainer keeps (`keep_last` = 3 steps and `best.pt`, each --mb MiB of random bytes). Each round
the "trainer" saves one step more (a new file, and a new `best.pt`) and prunes the oldest, then a
fetch runs; its wall time (the whole command, in-process: no Python start) is compared with the
time to read and hash, once, the checkpoints the host holds then (the floor, measured right
before each fetch, so both see the same page cache). Also printed: the bytes hashed per byte the
host holds, counted where meshrun makes every digest (`meshrun.fsutil`).

Ends with `REFETCH READS_PER_BYTE TIME_RATIO` (medians over the rounds after the first fetch).

Usage: .venv/bin/python bench/refetch.py [--mb 256] [--rounds 4]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meshrun import fsutil  # noqa: E402
from meshrun.deploy.commands.fetch import main as fetch_main  # noqa: E402
from meshrun.deploy.run.manifest import manifest_text  # noqa: E402
from tests.hashcount import CountingHashlib  # noqa: E402
from tests.localrun import local_h2_project  # noqa: E402

RUN = "20260101-000000-refetch"
KEEP_LAST = 3


def save(folder: Path, step: int, mb: int) -> None:
    """The trainer's save: the step's file, best.pt (this step's bytes), the manifest; the oldest
    step past keep_last pruned."""
    data = os.urandom(mb << 20)
    (folder / f"ckpt-step{step:09d}.pt").write_bytes(data)
    (folder / "best.pt").write_bytes(data)
    steps = sorted(folder.glob("ckpt-step*.pt"))
    for old in steps[:-KEEP_LAST]:
        old.unlink()
    files = {p.name: p for p in folder.glob("*.pt")}
    (folder / "MANIFEST.sha256").write_text(manifest_text({n: fsutil.sha256_file(p) for n, p in files.items()}))


def one_read(folder: Path) -> tuple[float, int]:
    """Seconds to read and hash, once, what the host holds; and how many bytes that is."""
    start, size = time.monotonic(), 0
    for path in sorted(folder.glob("*.pt")):
        hashlib.sha256(path.read_bytes()).hexdigest()
        size += path.stat().st_size
    return time.monotonic() - start, size


def rounds(root: Path, mb: int, count: int) -> list[tuple[float, float, float]]:
    """(fetch s, one read s, bytes hashed per byte held) for each fetch, the first one first."""
    project = local_h2_project(root, RUN)
    folder = root / "w2/runs" / RUN / "checkpoints"
    folder.mkdir(parents=True)
    for step in (100, 200, 300):
        save(folder, step, mb)
    counting, found = CountingHashlib(), []
    real_hashlib, fsutil.hashlib = fsutil.hashlib, counting  # type: ignore[assignment]
    try:
        for k in range(count + 1):
            if k:
                save(folder, 300 + 100 * k, mb)
            floor, held = one_read(folder)
            counting.hashed = 0
            start = time.monotonic()
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                status = fetch_main(RUN, None, False, project)
            took = time.monotonic() - start
            if status != 0:
                raise RuntimeError(f"fetch {k} exited {status}")
            found.append((took, floor, counting.hashed / held))
    finally:
        fsutil.hashlib = real_hashlib
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mr-refetch-") as tmp:
        found = rounds(Path(tmp), args.mb, args.rounds)
    print(f"one local host, keep_last {KEEP_LAST} + best.pt, {args.mb} MiB each; each fetch after one more save")
    print(f"{'fetch':<10} {'s':>8} {'one read s':>11} {'ratio':>7} {'hashed/held':>12}")
    for k, (took, floor, reads) in enumerate(found):
        label = "first" if k == 0 else f"after {k}"
        print(f"{label:<10} {took:>8.2f} {floor:>11.2f} {took / floor:>7.2f} {reads:>12.2f}")
    later = found[1:]
    reads = statistics.median(r for _, _, r in later)
    ratio = statistics.median(t / f for t, f, _ in later)
    print(f"REFETCH {reads:.2f} {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
