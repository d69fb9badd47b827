"""Which hosts may already hold the project's code, pure.

`fab train` syncs the code before every launch. When nothing changed since the last sync to a
host, that rsync costs an SSH connection of its own (a handshake, sshd's fork and exec, rsync on
both ends: 4 CPU-s for 32 hosts here, and about eight round trips over a far link) to send
nothing. So the controller remembers, per host, the digest of the code it last synced there
(deploy/host/codestat.py's `digest`), and when the project's digest is that one it first asks
the host, over the session `fab train` opens anyway, for the digest of what it holds; only a
host whose answer differs is synced. A host answers with a digest only while its workdir's record
of what the last sync sent (SHIPPED_LIST) lists exactly the names asked about: a file the project
no longer has, still in the workdir until a sync removes it, is no digest's (deploy/host/codestat.py).

The hint decides the order only, never what the host gets: a host with no hint, or an old one,
is synced at once (as before: its rsync starts beside the connect), and a hinted host whose
answer differs, is wrong or does not come is synced after it. A host that lies about its digest
skips only its own sync (it runs what it likes anyway), and the answer is compared, never used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from meshrun.deploy.inventory.model import Host

HINTS_MAX = 512  # hosts remembered; the oldest are dropped (a miss only means an rsync)


def hint_key(root: str, host: Host) -> str:
    """One project's code in one host's workdir, as the inventory reaches it."""
    what = repr((root, host.name, host.ssh_host, host.port, host.user, host.workdir))
    return hashlib.sha256(what.encode("utf-8", "surrogateescape")).hexdigest()


def parse_hints(data: bytes) -> dict[str, str]:
    """The stored hints; anything not a {key: digest} object of strings counts as none."""
    try:
        stored = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}


def with_synced(hints: Mapping[str, str], synced: Mapping[str, str], limit: int = HINTS_MAX) -> dict[str, str]:
    """`hints` with the digests just synced, newest last, at most `limit` of them."""
    merged = {k: v for k, v in hints.items() if k not in synced}
    merged.update(synced)
    return dict(list(merged.items())[-limit:])


def may_hold(hints: Mapping[str, str], key: str, digest: str) -> bool:
    """Whether the host is asked before it is synced: it was last synced this very code."""
    return hints.get(key) == digest
