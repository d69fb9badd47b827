"""A hostile host for the simulated cluster: it serves crafted files, symlinks, pipes, devices
and manifests from a run directory, and the controller holds canary files it must not touch.

No training runs: `plant_run` writes the host's run directory directly (as a compromised host
would) and saves a `launch.json` record under the test project `ROOT`, so `fab fetch-checkpoints
--run ID` goes to that host. Everything here is real: files in the host's private /root, a
FIFO and a character device made with mknod inside its namespace, sshd and rsync between them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshrun.deploy.edges.records import RunRecord, new_run_id
from tests.fabrun import ROOT

HOST_WORKDIR = "/root/meshrun"  # the testbed inventory's `~/meshrun` on a host

# Runs on the host: builds the run directory from a JSON spec on stdin.
_PLANT = r"""
import base64, json, os, stat, sys
spec = json.load(sys.stdin)
top = spec["dir"]
os.makedirs(top, exist_ok=True)
def at(rel):
    path = os.path.join(top, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path
for rel, data in spec["files"].items():
    with open(at(rel), "wb") as f:
        f.write(base64.b64decode(data))
for rel, size in spec["big"].items():
    with open(at(rel), "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
for rel, uid in spec["owners"].items():
    os.chown(at(rel), uid, uid)
# after chown, which clears setuid bits
for rel, mode in spec["modes"].items():
    os.chmod(at(rel), mode)
for rel, target in spec["links"].items():
    os.symlink(target, at(rel))
for rel in spec["fifos"]:
    os.mkfifo(at(rel))
for rel in spec["devices"]:
    os.mknod(at(rel), stat.S_IFCHR | 0o666, os.makedev(1, 3))
"""


@dataclass
class HostileRun:
    """What the host will serve, relative to its run directory."""

    files: dict[str, bytes] = field(default_factory=dict)
    big: dict[str, int] = field(default_factory=dict)  # random bytes, whole MiB
    modes: dict[str, int] = field(default_factory=dict)
    owners: dict[str, int] = field(default_factory=dict)  # uid (and gid) to give a file
    links: dict[str, str] = field(default_factory=dict)
    fifos: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # char device 1,3 (what /dev/null is)


@dataclass(frozen=True)
class Canary:
    """A file on the controller that a host aims at; it must stay exactly as it was."""

    path: Path
    content: bytes
    mtime_ns: int

    @staticmethod
    def make(path: Path, content: bytes) -> Canary:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return Canary(path, content, path.stat().st_mtime_ns)

    def untouched(self) -> bool:
        return self.path.is_file() and self.path.read_bytes() == self.content \
            and self.path.stat().st_mtime_ns == self.mtime_ns


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(*lines: bytes) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def plant_run(testbed, host: int, inventory: Path, run: HostileRun) -> str:
    """Write `run` as host `host`'s run directory and record the run on the controller
    (`ROOT/runs/<id>/launch.json`); returns the run id."""
    return plant_runs(testbed, {host: run}, inventory)


def plant_runs(testbed, runs: dict[int, HostileRun], inventory: Path) -> str:
    """`plant_run` for several hosts of one run: each host's run directory, one record naming them all."""
    run_id = new_run_id()
    for host, run in runs.items():
        spec = {"dir": f"{HOST_WORKDIR}/runs/{run_id}",
                "files": {k: base64.b64encode(v).decode() for k, v in run.files.items()},
                "big": run.big, "modes": run.modes, "owners": run.owners, "links": run.links, "fifos": run.fifos,
                "devices": run.devices}
        testbed.exec(host, ["python3", "-c", _PLANT], input=json.dumps(spec), timeout=120)
    first = min(runs)
    RunRecord(run_id, str(inventory), tuple(f"h{h}" for h in sorted(runs)), time.time() - 3600, False,
              f"10.77.0.1{first}:29400").save(ROOT / "runs")
    return run_id


def remove_run(testbed, host: int, run_id: str) -> None:
    testbed.exec(host, ["rm", "-rf", f"{HOST_WORKDIR}/runs/{run_id}"], check=False)


def odd_entries(top: Path) -> list[str]:
    """Anything under `top` that is not a plain folder or a plain file owned by us without
    setuid/setgid bits: links, FIFOs, devices, sockets, foreign owners."""
    odd = []
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            info = os.lstat(os.path.join(here, name))
            plain = stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)
            if not plain or info.st_mode & (stat.S_ISUID | stat.S_ISGID) or info.st_uid != os.getuid():
                odd.append(f"{os.path.join(here, name)} mode {oct(info.st_mode)} uid {info.st_uid}")
    return sorted(odd)


def tree(top: Path) -> dict[str, bytes]:
    """{relative path: bytes} of the regular files under `top` (links not followed)."""
    found = {}
    for here, _, files in os.walk(top):
        for name in files:
            path = Path(here, name)
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(top).as_posix()] = path.read_bytes()
    return found


def listing(top: Path, skip: Path) -> set[str]:
    """Every path under `top` except those under `skip`: to see that nothing else was created."""
    found = set()
    for here, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if Path(here, d) != skip]
        found.update(os.path.join(here, n) for n in dirs + files)
    return found
