"""Run one function per host in parallel. Partial failure is data: each host maps to its
result or to the MeshrunError it raised. A hung host costs at most `timeout` and one thread of a
bounded pool.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Generic, Iterable, Sequence, TypeVar

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


FANOUT_WORKERS = 64  # threads of one fan-out at most: 32 hosts run at once, 1000 in waves


def on_each(hosts: Iterable[Host], fn: Callable[[Host], T], timeout: float | None = None,
            workers: int = FANOUT_WORKERS) -> HostResults[T]:
    """fn(host) on every host in parallel, on at most `workers` threads that take hosts in order.
    `timeout` bounds each wave of `workers` hosts (the whole fan-out waits at most that many
    times): a host that never answers holds one thread, never serialises the others, and is an
    error naming it. Other exceptions than MeshrunError propagate. A name given twice is one host,
    served once by its first entry: the results are keyed by name, so a second entry could never
    be waited for (the fan-out took its whole timeout) and its fn would race the first's there."""
    unique: dict[str, Host] = {}
    hosts = [unique.setdefault(h.name, h) for h in hosts if h.name not in unique]  # each name once, its first entry
    results: dict[str, T | MeshrunError] = {}
    crashes: list[BaseException] = []
    turns: queue.SimpleQueue[Host] = queue.SimpleQueue()
    for host in hosts:
        turns.put(host)
    changed = threading.Condition()

    def work() -> None:
        while not crashes:
            try:
                host = turns.get_nowait()
            except queue.Empty:
                return
            try:
                outcome: T | MeshrunError = fn(host)
            except MeshrunError as err:
                outcome = err
            except BaseException as err:  # a bug: re-raised in the caller's thread below
                with changed:
                    crashes.append(err)
                    changed.notify_all()
                return
            with changed:
                results[host.name] = outcome
                changed.notify_all()

    threads = min(max(1, workers), len(hosts))
    # Daemon threads: a host that never answers must not keep the controller alive.
    for n in range(threads):
        threading.Thread(target=work, daemon=True, name=f"fanout-{n}").start()
    waves = -(-len(hosts) // threads) if hosts else 0
    deadline = None if timeout is None else time.monotonic() + timeout * waves
    _wait_until(changed, lambda: len(results) == len(hosts) or bool(crashes), deadline)
    if crashes:
        raise crashes[0]
    for host in hosts:
        if host.name not in results:
            results[host.name] = MeshrunError(f"host '{host.name}': no answer within {timeout:g} s")
    return HostResults((h.name, results[h.name]) for h in hosts)


def _wait_until(changed: threading.Condition, done: Callable[[], bool], deadline: float | None) -> None:
    """Wait on `changed` until done() holds or the monotonic deadline (None: none) passes."""
    with changed:
        while not done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            changed.wait(left)


def start_each(items: Sequence[T], start: Callable[[T], None], workers: int = FANOUT_WORKERS) -> None:
    """start(item) for every item in parallel, on at most `workers` threads (each start bounds its
    own wait; one that fails says so itself). A Ctrl-C meanwhile hands out no more items and waits
    for the starts in flight before it is raised: the stop that follows must reach every start that
    happened, and none may begin after it."""
    turns: queue.SimpleQueue[T] = queue.SimpleQueue()
    for item in items:
        turns.put(item)
    cancelled = threading.Event()
    crashes: list[BaseException] = []

    def work(done: threading.Event) -> None:
        try:
            while not cancelled.is_set():
                try:
                    item = turns.get_nowait()
                except queue.Empty:
                    return
                try:
                    start(item)
                except BaseException as err:  # a bug: re-raised in the caller's thread below
                    crashes.append(err)
                    cancelled.set()
        finally:
            done.set()

    count = min(max(1, workers), len(items))
    finished = [threading.Event() for _ in range(count)]
    threads = [threading.Thread(target=work, args=(finished[n],), daemon=True, name=f"start-{n}") for n in range(count)]

    interrupted = False
    while True:
        try:  # the whole of it: a Ctrl-C lands on any bytecode, the loop's own included
            _start_and_wait(threads, finished, cancelled)
            break
        except KeyboardInterrupt:
            interrupted = True
            cancelled.set()
    if crashes:
        raise crashes[0]
    if interrupted:
        raise KeyboardInterrupt


def _start_and_wait(threads: list[threading.Thread], finished: list[threading.Event],
                    cancelled: threading.Event) -> None:
    """Start each thread unless cancelled, then wait for each that started; called again after a
    Ctrl-C, it then starts none and waits for those running. Each thread's own event, not join or
    is_alive: Python 3.11's join, cut by a KeyboardInterrupt, can mark a thread that still runs as
    stopped (its bpo-45274 handling), and a start in flight then went unwaited. A thread with no
    ident yet has not run: it takes no item now (cancelled is set first)."""
    for thread in threads:
        if not cancelled.is_set():
            thread.start()
    for thread, done in zip(threads, finished):
        while thread.ident is not None and not done.wait(0.2):
            pass
