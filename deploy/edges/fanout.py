"""Run one function per host in parallel. Partial failure is data: each host maps to its
result or to the MeshrunError it raised. A hung host costs at most `timeout`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, Iterable, TypeVar

from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host

T = TypeVar("T")


class HostResults(dict, Generic[T]):
    """{host name: result or its MeshrunError}, in host order (the shape of Fabric's GroupResult)."""

    @property
    def ok(self) -> dict[str, T]:
        return {name: r for name, r in self.items() if not isinstance(r, MeshrunError)}

    @property
    def failed(self) -> dict[str, MeshrunError]:
        return {name: r for name, r in self.items() if isinstance(r, MeshrunError)}

    def require_all(self) -> dict[str, T]:
        """The results if every host succeeded, else one MeshrunError naming each failure."""
        if self.failed:
            raise MeshrunError("; ".join(str(e) for e in self.failed.values()))
        return dict(self)


def on_each(hosts: Iterable[Host], fn: Callable[[Host], T], timeout: float | None = None) -> HostResults[T]:
    """fn(host) on every host in parallel threads. Other exceptions than MeshrunError propagate."""
    hosts = list(hosts)
    results: dict[str, T | MeshrunError] = {}
    crashes: list[BaseException] = []

    def work(host: Host) -> None:
        try:
            results[host.name] = fn(host)
        except MeshrunError as err:
            results[host.name] = err
        except BaseException as err:  # a bug: re-raised in the caller's thread below
            crashes.append(err)

    # Daemon threads: a host that never answers must not keep the controller alive.
    threads = [threading.Thread(target=work, args=(h,), daemon=True, name=f"host-{h.name}") for h in hosts]
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if crashes:
        raise crashes[0]
    for host in hosts:
        if host.name not in results:
            results[host.name] = MeshrunError(f"host '{host.name}': no answer within {timeout:.0f} s")
    return HostResults((h.name, results[h.name]) for h in hosts)
