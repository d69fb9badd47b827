"""The rendezvous port on every host that may host a run's store, pure.

The store opens the inventory's `rendezvous.port` (fixed per inventory: users open it in their
firewalls) on the rendezvous host. An elastic run's store moves down the succession order when its
host is lost (deploy/run/plan.py::succession_order), and each successor then opens that same port
with `is_host=1`, where torch gives up on EADDRINUSE (no fallback to a client): another run's store
there ends the run the failover was meant to save. So the pre-flight asks every successor whether
the port is free (deploy/host/links.py `listen ... bind`: bound, never listened on, let go at once),
and the host stamp of every store host says whether it is free right now (deploy/host/stamp.py),
so a reused pass never stands for a busy port (deploy/commands/check.py::preflight).
"""

from __future__ import annotations

import json

from meshrun.deploy.check.findings import Finding, fail
from meshrun.deploy.check.verdicts import RendezvousFacts
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.plan import succession_order

FREE = "free"  # a successor's listener bound the port and let it go; a stamp's port that is free now
STAMP_STATES = (FREE, "in use", "unavailable")  # deploy/host/stamp.py's `rdzv`, nothing else
STAMP_MAX = 100_000  # characters of a stamp line read: a few hundred in practice


def store_hosts(selection: Selection, elastic: bool) -> tuple[Host, ...]:
    """The hosts whose rendezvous port the run needs free, in succession order: the rendezvous host;
    for an elastic run every host of the succession. A local host opens none (a standalone run)."""
    order = succession_order(selection) if elastic else (selection.head,)
    return tuple(h for h in order if not h.is_local)


def successor_names(selection: Selection, elastic: bool) -> tuple[str, ...]:
    """The store hosts but the rendezvous host: those whose port is bound, not listened on."""
    return tuple(h.name for h in store_hosts(selection, elastic) if h.name != selection.head.name)


def successor_findings(successors: tuple[RendezvousFacts, ...]) -> list[Finding]:
    """A FAIL for each successor whose rendezvous port could not be bound, naming host and port."""
    return [fail(s.host, f"rendezvous port {s.port} cannot be opened on {s.host} ({s.address}): {said(s.listener)}; "
                         f"this elastic run's store moves there if its rendezvous host is lost, and that failover "
                         "would fail (another run's store? `fab status`; or give this inventory another "
                         "`rendezvous.port`)")
            for s in successors if s.listener != FREE]


def stamp_port(text: str) -> str | None:
    """The `rdzv` of a stamp (deploy/host/stamp.py), which the host wrote: one of STAMP_STATES when
    the stamp is exactly one JSON object holding it, else None (login noise, an older probe, any
    other shape): only a stamp that says "free" in so many words vouches for the port."""
    if len(text) > STAMP_MAX:
        return None
    try:
        stamp = json.loads(text)
    except (ValueError, RecursionError):
        return None
    state = stamp.get("rdzv") if isinstance(stamp, dict) else None
    return state if isinstance(state, str) and state in STAMP_STATES else None
