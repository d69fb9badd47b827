"""Host-side stamp for reusing a passed pre-flight; stdlib only, run as `python -c <this file> [ADDRESS PORT]`.

Prints one line that changes when what the pre-flight checked on this host may have changed:
the boot id (a reboot: new devices, drivers, firewall), the interpreter and its version, and the
modification times of the site-packages folders and of torch's folder (an install, upgrade or
removal rewrites their entries). Finding torch's folder does not import it: this costs tens of
milliseconds where the pre-flight's torch import costs seconds (deploy/run/preflightkey.py).

With ADDRESS and PORT (a host that hosts the run's store: the rendezvous host, and for an elastic
run every successor) also `"rdzv"`: whether the rendezvous port is free right now, "free", "in use"
or "unavailable" (any other bind error). Another run's store there changes the stamp, so a passed
pre-flight is not reused over a busy port (deploy/check/ports.py).

Also `"gpus_busy"`: the indices of the GPUs with over BUSY_MIB in use now (nvidia-smi's
`memory.used`, the figure and threshold of the pre-flight's busy-GPU WARN, deploy/check/gpus.py).
A GPU that fills or frees changes the stamp, so a reuse never hides a newly busy GPU nor replays a
WARN about one that is free again. Without nvidia-smi the list is empty (no GPU to fill); an
nvidia-smi that fails or gives no answer in SMI_TIMEOUT_S leaves this probe without a stamp (exit
status 1): what the GPUs hold is unknown, so the pre-flight runs.

Also `"requirements"`: the digest of the project's requirements that `fab setup` last installed in
this workdir's venv (its record, deploy/host/setup.py's STAMP), or null. The controller compares
it with the digest of its own requirements on every launch, reused pass or not, and warns of a
requirements.txt changed since setup (deploy/check/sincesetup.py). Only when this interpreter is
that venv's: a host whose inventory `python:` runs another environment did not get its packages
from that setup, so the record says nothing of it. A `setup` rerun changes it, and so the stamp.

Also `"project"`, from the same record: the digest of the project's build files (pyproject.toml,
setup.py, setup.cfg) from which `fab setup` last installed the project itself (`pip install
--no-deps -e .`), or null: a package or entry point added to them since is not installed here,
and the controller warns of it as of the requirements.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import site
import socket
import stat
import subprocess
import sys

BUSY_MIB = 1024  # a copy of meshrun.layout.GPU_BUSY_MIB (this file travels alone); tests hold them equal
EXTRA_PATH = ("~/bin", "/usr/sbin", "/usr/local/sbin", "/sbin")  # deploy/host/facts.py's: the same nvidia-smi
SMI_QUERY = ("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
SMI_TIMEOUT_S = 10  # a hung driver: no stamp, the pre-flight runs and says what nvidia-smi did
SMI_READ = 1 << 16  # a few dozen bytes per GPU
VENV = ".venv"  # deploy/host/setup.py's VENV and STAMP, in the workdir this runs in; tests hold them equal
SETUP_RECORD = os.path.join(VENV, "meshrun-installed")
RECORD_READ = 1 << 12  # setup's record is one short JSON object


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def port_state(address: str, port: int) -> str:
    """Whether torch's store could open `port` here now. The wildcard is bound, as deploy/host/links.py's
    listener does first (the store binds every address: a listener on any one of them holds the port),
    with SO_REUSEADDR as the store sets it (TIME_WAIT is no conflict); never listened on, so nothing can
    connect, and closed at once. A copy of links.py's test: each probe travels alone as `python -c`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    except OSError as err:
        return "in use" if err.errno == errno.EADDRINUSE else "unavailable"
    return "free"


def _count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) < 10  # `²`.isdigit() too, int() refuses it


def busy_gpus() -> list[int]:
    """The indices of the GPUs with over BUSY_MIB in use, sorted; [] without nvidia-smi. Exits with
    status 1 (no stamp) when nvidia-smi fails or hangs. A GPU whose memory it cannot tell (`[N/A]`)
    is not listed: the pre-flight's parser skips it too (deploy/edges/host_queries.parse_gpus)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *(os.path.expanduser(p) for p in EXTRA_PATH)])
    tool = shutil.which("nvidia-smi", path=search)
    if tool is None:
        return []
    try:
        done = subprocess.run([tool, *SMI_QUERY], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        sys.exit(f"nvidia-smi: {err}")
    if done.returncode != 0:
        sys.exit(f"nvidia-smi: exit status {done.returncode}")
    busy: set[int] = set()
    for line in done.stdout[:SMI_READ].splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and _count(parts[0]) and _count(parts[1]) and int(parts[1]) > BUSY_MIB:
            busy.add(int(parts[0]))
    return sorted(busy)


def setup_record(field: str) -> str | None:
    """A digest setup recorded for the workdir's venv (`requirements`, `project`), as written (the
    controller checks its shape); None when this python is not that venv's, or there is no readable
    record. Opened without blocking and read only if a regular file: a FIFO there must not hang the stamp."""
    try:
        if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
            return None
        fd = os.open(SETUP_RECORD, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            data = os.read(fd, RECORD_READ) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        record = json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
    found = record.get(field) if isinstance(record, dict) else None
    return found if isinstance(found, str) else None


def main(argv: list[str]) -> None:
    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(spec.origin) if spec and spec.origin else ""
    folders = sorted(set(site.getsitepackages() + [site.getusersitepackages()]))
    stamp = {"boot": _boot_id(), "python": os.path.realpath(sys.executable), "version": sys.version,
             "site": [[p, _mtime(p)] for p in folders], "torch": [torch_dir, _mtime(torch_dir) if torch_dir else None],
             "gpus_busy": busy_gpus(), "requirements": setup_record("requirements"), "project": setup_record("project")}
    if len(argv) == 2:
        stamp["rdzv"] = port_state(argv[0], int(argv[1]))
    print(json.dumps(stamp, sort_keys=True))


if __name__ == "__main__":  # `python -c` runs it as __main__; tests import it for BUSY_MIB
    main(sys.argv[1:])
