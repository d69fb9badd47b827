"""on_each: a bounded pool of threads, partial failure as data, a hung host named and bounded.
start_each: the launch's starts, all at once, and a Ctrl-C that waits for the starts in flight."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from meshrun.deploy.edges.fanout import on_each, start_each
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host


def hosts(n: int) -> list[Host]:
    """on_each reads only a host's name."""
    return [SimpleNamespace(name=f"h{i}") for i in range(1, n + 1)]  # type: ignore[misc]


def test_results_keep_host_order_and_failures_are_data() -> None:
    def fn(host: Host) -> str:
        if host.name == "h2":
            raise MeshrunError("h2 said no")
        return host.name.upper()

    results = on_each(hosts(3), fn, timeout=10)
    assert list(results) == ["h1", "h2", "h3"]
    assert results.ok == {"h1": "H1", "h3": "H3"} and [str(e) for e in results.failed.values()] == ["h2 said no"]


def test_never_more_threads_than_the_pool_and_every_host_is_served() -> None:
    running, most, lock = 0, 0, threading.Lock()

    def fn(host: Host) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return host.name

    results = on_each(hosts(40), fn, timeout=10, workers=8)
    assert most == 8
    assert results.ok == {f"h{i}": f"h{i}" for i in range(1, 41)}


def test_a_hung_host_holds_one_thread_and_is_named_while_the_others_answer() -> None:
    release = threading.Event()

    def fn(host: Host) -> str:
        if host.name == "h1":
            release.wait(30)  # never answers within the fan-out's deadline
        return host.name

    try:
        results = on_each(hosts(4), fn, timeout=0.5, workers=2)
    finally:
        release.set()
    assert results.ok == {f"h{i}": f"h{i}" for i in range(2, 5)}
    assert [str(e) for e in results.failed.values()] == ["host 'h1': no answer within 0.5 s"]


def test_a_bug_in_fn_is_raised_in_the_caller() -> None:
    def fn(host: Host) -> str:
        raise KeyError(host.name)

    with pytest.raises(KeyError):
        on_each(hosts(3), fn, timeout=5)


def test_every_start_runs_at_once_so_a_slow_one_holds_back_none() -> None:
    """Each start waits at a barrier for all the others: started one after another, the first
    would wait alone until the barrier broke."""
    barrier, started = threading.Barrier(5, timeout=30), []

    def start(item: int) -> None:
        barrier.wait()
        started.append(item)

    start_each(list(range(5)), start)
    assert sorted(started) == [0, 1, 2, 3, 4] and not barrier.broken


def test_a_ctrl_c_during_the_starts_waits_for_those_in_flight_and_begins_none_after() -> None:
    """The first start is interrupted (a SIGINT's KeyboardInterrupt in the caller's thread) while
    every start takes a while: the KeyboardInterrupt comes out only after each start that began has
    ended, and the queue is not emptied (the stop that follows must see every started host)."""
    began, ended = [], []

    def start(item: int) -> None:
        began.append(item)
        if item == 0:
            _thread.interrupt_main()
        time.sleep(0.3)
        ended.append(item)

    # Python's own SIGINT handler for this test: a pytest-xdist worker ignores SIGINT, and
    # interrupt_main() then raises nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_each(list(range(40)), start, workers=2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(ended) == sorted(began) and 0 in began and len(began) < 40


def test_a_bug_in_a_start_is_raised_in_the_caller_and_stops_the_handing_out() -> None:
    def start(item: int) -> None:
        if item == 1:
            raise ValueError("bug")
        time.sleep(0.05)

    with pytest.raises(ValueError, match="bug"):
        start_each(list(range(200)), start, workers=2)
