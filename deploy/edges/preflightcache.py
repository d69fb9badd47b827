"""The controller's record of the last passed pre-flight, and the host stamps that key it (each
also carries the host's setup record of the project's requirements: deploy/check/sincesetup.py).

The rule (what is compared, for how long) is pure in deploy/run/preflightkey.py. The record is
one small JSON file in the user's cache folder, written atomically; a missing or unreadable
file simply means "run the pre-flight".
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from meshrun.fsutil import read_regular
from meshrun.deploy.inputfiles import RECORD_MAX
from meshrun.deploy.check.ports import FREE, stamp_port
from meshrun.deploy.edges.check_probes import FACTS_TIMEOUT_S, probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.run.plan import python_of


@dataclass(frozen=True)
class StoredPass:
    """A pre-flight without FAILs: its key, when (time.time()), and the warnings it showed."""
    key: str | None
    at: float | None
    warnings: tuple[str, ...] = ()


NOTHING = StoredPass(None, None)


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "meshrun" / "preflight.json"


def stamp_lines(hosts: tuple[Host, ...], sessions: Mapping[str, Session], local_python: str,
                rdzv_port: int | None = None, stores: tuple[Host, ...] = ()) -> dict[str, str]:
    """Each host's stamp line as it answered (deploy/host/stamp.py); a host that gave none (a failed
    or hung nvidia-smi there, a lost session) is left out. The `stores` (the hosts that host the
    run's store, deploy/check/ports.py) also try to bind `rdzv_port`."""
    asked = {h.name for h in stores} if rdzv_port is not None else set()

    def one(host: Host) -> str:
        port = [host.address, str(rdzv_port)] if host.name in asked else []
        # create_workdir: the pre-flight runs first on a fresh host, whose workdir sync has yet to make.
        result = sessions[host.name].run(probe_argv(python_of(host, local_python), "stamp", *port),
                                         timeout=FACTS_TIMEOUT_S, create_workdir=True)
        return result.stdout.strip() if result.ok else ""

    results = on_each(hosts, one, timeout=FACTS_TIMEOUT_S * 2)
    return {name: line for name, line in results.ok.items() if line}


def keyed_stamps(lines: Mapping[str, str], hosts: tuple[Host, ...], rdzv_port: int | None = None,
                 stores: tuple[Host, ...] = ()) -> dict[str, str] | None:
    """The stamps that key a pass (deploy/run/preflightkey.py): every host's, or None when any host
    gave none, or a store host's does not say its port is "free" (the pre-flight then runs, with its FAIL)."""
    asked = {h.name for h in stores} if rdzv_port is not None else set()
    if any(h.name not in lines for h in hosts) or any(stamp_port(lines.get(name, "")) != FREE for name in asked):
        return None
    return {h.name: lines[h.name] for h in hosts}


def host_stamps(hosts: tuple[Host, ...], sessions: Mapping[str, Session], local_python: str,
                rdzv_port: int | None = None, stores: tuple[Host, ...] = ()) -> dict[str, str] | None:
    """Each host's stamp (deploy/host/stamp.py, its busy GPUs included); None when any host cannot
    give one (an nvidia-smi there that fails or hangs, too). The `stores`
    (the hosts that host the run's store, deploy/check/ports.py) also try to bind `rdzv_port`: a
    store host whose stamp does not say "free" gives none, so the pre-flight runs with its FAIL."""
    return keyed_stamps(stamp_lines(hosts, sessions, local_python, rdzv_port, stores), hosts, rdzv_port, stores)


def load_pass(path: Path) -> StoredPass:
    """The stored pass (NOTHING when there is none or it cannot be read)."""
    try:
        record = json.loads(read_regular(path, RECORD_MAX))  # a FIFO or /dev/zero here is no pass
        return StoredPass(str(record["key"]), float(record["at"]), tuple(str(w) for w in record["warnings"]))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return NOTHING


def save_pass(path: Path, stored: StoredPass) -> None:
    """Store a pass; never fatal (the next run just checks again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".preflight-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": stored.key, "at": stored.at, "warnings": list(stored.warnings)}, f)
        os.replace(tmp, path)
    except OSError:
        pass
