"""When a passed pre-flight may be reused, pure.

The pre-flight (deploy/commands/check.py::preflight) costs seconds: every host imports torch
and opens listeners. Before a run that follows a recent one nothing it checks has usually
changed, so a PASS is reused when all of this is unchanged (the key) and it is recent (the age):

- the selected hosts as the inventory describes them (name, address, port, user, python,
  workdir, network, GPUs, identity) and the rendezvous port: `repr` of the frozen dataclasses;
- each host's stamp: its boot id, its python's path and version, and the modification times
  of its site-packages folders and of torch's own folder (any install or removal changes
  them), and which of its GPUs have over GPU_BUSY_MIB in use (the pre-flight's busy-GPU WARN:
  a GPU that fills or frees since is a new key, no reuse), and the requirements digest `fab setup`
  recorded in the venv (a setup since is a new key); read by one cheap command per host
  (deploy/host/stamp.py: no torch import); on the hosts that will hold the rendezvous store
  (the head, every successor when elastic), whether its port is free now: only `free` allows a
  reuse (another run's store there must FAIL by name);
- whether the run is elastic (its successors' ports are then part of what passed);
- at most PREFLIGHT_REUSE_S seconds since that PASS.

The controller's own requirements are not in the key: whether a host was set up with them is
said on every launch from the same stamps, reused or not (deploy/check/sincesetup.py).

A failed pre-flight is never reused: it stops the run and nothing is stored. A pass with
warnings is stored with them, and a reuse shows them again. Host keys are
not part of this: SSH checks them on every connection. `--skip-checks` still skips it all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from meshrun.layout import PREFLIGHT_REUSE_S


def preflight_key(selection_repr: str, stamps: Mapping[str, str]) -> str:
    """sha256 over the selection and every host's stamp, in host-name order."""
    digest = hashlib.sha256(selection_repr.encode("utf-8", "surrogateescape"))
    for name in sorted(stamps):
        digest.update(b"\0" + name.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(stamps[name].encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def may_reuse(stored_key: str | None, stored_at: float | None, key: str, now: float,
              reuse_s: float = PREFLIGHT_REUSE_S) -> bool:
    """A stored PASS stands in for a new pre-flight: same key, at most `reuse_s` old, not from the future."""
    if stored_key is None or stored_at is None:
        return False
    return stored_key == key and 0.0 <= now - stored_at <= reuse_s
