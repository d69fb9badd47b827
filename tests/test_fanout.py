"""on_each: a bounded pool of threads, partial failure as data, a hung host named and bounded."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from meshrun.deploy.edges.fanout import on_each
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
