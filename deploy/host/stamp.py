"""Host-side stamp for reusing a passed pre-flight; stdlib only, run as `python -c <this file>`.

Prints one line that changes when what the pre-flight checked on this host may have changed:
the boot id (a reboot: new devices, drivers, firewall), the interpreter and its version, and the
modification times of the site-packages folders and of torch's folder (an install, upgrade or
removal rewrites their entries). Finding torch's folder does not import it: this costs tens of
milliseconds where the pre-flight's torch import costs seconds (deploy/run/preflightkey.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import sys


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


def main() -> None:
    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(spec.origin) if spec and spec.origin else ""
    folders = sorted(set(site.getsitepackages() + [site.getusersitepackages()]))
    stamp = {"boot": _boot_id(), "python": os.path.realpath(sys.executable), "version": sys.version,
             "site": [[p, _mtime(p)] for p in folders], "torch": [torch_dir, _mtime(torch_dir) if torch_dir else None]}
    print(json.dumps(stamp, sort_keys=True))


main()
