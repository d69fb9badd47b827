"""Steps several tasks share: open sessions to hosts (and always close them), find their
training interfaces."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.edges.host_queries import peer_address_for, route_dev
from meshrun.deploy.edges.transport import CommandResult, Session, connect

T = TypeVar("T")


def reachable_results(sessions: Mapping[str, Session], names: Iterable[str], argv: list[str],
                      timeout: float) -> Iterator[tuple[str, CommandResult]]:
    """(host, result) of `argv` on each named host that still answers, in the order named; after a
    run, some may not (and a host without a session here is skipped). All hosts at once: one after
    another, each host gone silent since the run cost its whole timeout."""
    asked = [sessions[name].host for name in names if name in sessions]
    results = on_each(asked, lambda host: sessions[host.name].run(argv, timeout=timeout), timeout=timeout + 5)
    for host in asked:
        if host.name in results.ok:
            yield host.name, results.ok[host.name]


FIRST_BATCH = 8  # hosts asked at a time where the first answer will do (rank 0's host is among the first)


def first_found(sessions: Mapping[str, Session], names: Iterable[str], argv: list[str], timeout: float,
                read: Callable[[CommandResult], T | None]) -> T | None:
    """read(result) of the first named host, in order, whose successful result reads (not None):
    FIRST_BATCH hosts at a time, so a silent host costs its batch one timeout and a thousand
    hosts are not all asked for what the first one holds."""
    asked = [name for name in names if name in sessions]
    for start in range(0, len(asked), FIRST_BATCH):
        for _, result in reachable_results(sessions, asked[start:start + FIRST_BATCH], argv, timeout):
            if result.ok and (found := read(result)) is not None:
                return found
    return None


def connect_all(hosts: tuple[Host, ...], inventory: Inventory, root: Path) -> dict[str, Session]:
    """An open session per host, or one error naming every host that failed."""
    sshtarget.check_all(hosts)  # a bad ssh_config value is one line before any host is contacted
    results = on_each(hosts, lambda h: connect(h, inventory.known_hosts, root), timeout=30)
    if results.failed:
        close_all(results.ok)
    return results.require_all()


CLOSE_WAIT_S = 5.0


def close_all(sessions: Mapping[str, Session]) -> None:
    """Close every session, in parallel, waiting at most CLOSE_WAIT_S: closing SSH to a host whose
    link is cut (no reset ever comes) can block for TCP's whole retransmission timeout, and must not
    keep the controller from finishing. The closing threads are daemons: they die with it."""
    threads = [threading.Thread(target=session.close, daemon=True, name=f"close-{name}")
               for name, session in sessions.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + CLOSE_WAIT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def sessions_to(hosts: tuple[Host, ...], inventory: Inventory, root: Path) -> Iterator[dict[str, Session]]:
    """`with sessions_to(hosts, inventory, root) as sessions:` — every host connected (or one error
    naming each that failed), and every session closed on the way out, whatever happens."""
    sessions = connect_all(hosts, inventory, root)
    try:
        yield sessions
    finally:
        close_all(sessions)


class SessionsLater:
    """Sessions that a step started before the connect may use once they are open: `fab train`'s
    code sync starts first and asks a hinted host over its session (deploy/run/codehint.py).
    `put` is called once they are open, and again (ignored) on every way out, so `get` never
    waits past the connect: an empty put means "none"."""

    def __init__(self) -> None:
        self._sessions: Mapping[str, Session] | None = None
        self._put = threading.Event()

    def put(self, sessions: Mapping[str, Session]) -> None:
        if not self._put.is_set():
            self._sessions = sessions
            self._put.set()

    def get(self, name: str, timeout: float) -> Session | None:
        """The host's session, when the connect gave one within `timeout` s."""
        if not self._put.wait(timeout) or self._sessions is None:
            return None
        return self._sessions.get(name)


def training_interfaces(hosts: tuple[Host, ...], head: Host, sessions: Mapping[str, Session]) -> dict[str, str]:
    """Per host of `hosts`, the interface that routes to the rendezvous host `head` (for
    NCCL/GLOO_SOCKET_IFNAME). `head` need not be among `hosts` nor have a session: a join into a
    --firewall run after its first rendezvous host died asks only the live members, and a route to
    a dead host's address is still the route to its network."""
    if len(hosts) == 1 and hosts[0].is_local:
        return {}
    addresses = {h.name: h.address for h in (*hosts, head)}  # a head among `hosts` keeps its place

    def probe(host: Host) -> str:
        peer = peer_address_for(host.name, head.name, addresses)
        return route_dev(sessions[host.name], peer) if peer else ""

    results = on_each(hosts, probe, timeout=30).require_all()
    return {name: iface for name, iface in results.items() if iface}
