"""Rendezvous succession on a host: watch the current rendezvous host's c10d store, and say when it
is gone so the agent can move its run to the next generation (docs/elastic.md).

torchrun's store lives on one host; when that host is killed or cut off, the survivors' torchrun
cannot re-rendezvous. Every agent therefore probes the store of the current generation's host
with a plain TCP connect. A killed host refuses at once; a cut one times out. Two misses in a row,
after the store was seen up once, mean it is lost. A store never seen up gets a start-up grace
instead (its host may still be importing torch). Standard library only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

PROBE_EVERY_S = 2.0
CONNECT_TIMEOUT_S = 2.0
MISSES_BEFORE_LOST = 2
STARTUP_GRACE_S = 90.0  # a new rendezvous host imports torch and starts torchrun first
# The store gone while this host's workers are already gone: the run may have ended (the rendezvous
# host's torchrun exits, its store with it, while this torchrun is still in torch's exit barrier or
# rendezvous shutdown). Its own exit status decides, if it comes within this long.
WORKERS_DONE_GRACE_S = 30.0


@dataclass(frozen=True)
class Generation:
    """One rendezvous of the succession (planned by the controller, see deploy/run/plan.py)."""

    head: str
    endpoint: str  # "address:port"
    torchrun: tuple[str, ...]


def parse_generations(text: str) -> tuple[Generation, ...]:
    """The agent's `--succession` JSON: a list of {head, endpoint, torchrun}."""
    items = json.loads(text)
    return tuple(Generation(str(i["head"]), str(i["endpoint"]), tuple(str(a) for a in i["torchrun"])) for i in items)


def store_answers(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class HeadWatcher:
    """A thread that marks `lost` once the rendezvous host's store stops answering."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.lost = False
        self.seen = False
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="head-watcher")
        self._thread.start()

    def _run(self) -> None:
        misses = 0
        while not self._stop.wait(PROBE_EVERY_S) and not self.lost:
            if store_answers(self.endpoint):
                self.seen, misses = True, 0
                continue
            misses += 1
            waited = time.monotonic() - self._started
            if (self.seen and misses >= MISSES_BEFORE_LOST) or (not self.seen and waited > STARTUP_GRACE_S):
                self.lost = True

    def confirm_lost(self) -> bool:
        """After torchrun failed by itself: is its rendezvous host gone (two quick probes)?"""
        if self.lost:
            return True
        if not self.seen:
            return False  # never up: not a succession case, a start-up failure
        self.lost = not any(store_answers(self.endpoint) for _ in range(MISSES_BEFORE_LOST))
        return self.lost

    def stop(self) -> None:
        self._stop.set()


def parse_peers(text: str) -> dict[str, str]:
    """The agent's `--peers` JSON: {host name: "address:port" of its sshd on the training network}."""
    items = json.loads(text)
    return {str(name): str(endpoint) for name, endpoint in items.items()}


class PeerWatcher:
    """Detached elastic runs: the other hosts' sshd on the training network, probed like the store.

    With no controller, nothing else notices a worker host whose link is cut (no reset reaches
    anyone): the survivors' workers would sit in a collective for the whole process-group
    timeout. A peer that answered once and then misses twice in a row is reported once by
    `take_lost()`, and again only after it has answered in between; a reported peer that answers
    again is reported once by `take_back()` (its link is back: the `host_back` notification). A
    peer never seen up (its sshd is elsewhere, or a firewall is in the way) is never reported: a
    wrong guess costs the fast path, never a false alarm."""

    def __init__(self, peers: dict[str, str]) -> None:
        self._lost: list[str] = []
        self._back: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(name, endpoint), daemon=True,
                                          name=f"peer-watcher-{name}") for name, endpoint in peers.items()]
        for thread in self._threads:
            thread.start()

    def _watch(self, name: str, endpoint: str) -> None:
        seen, misses, reported = False, 0, False
        while not self._stop.wait(PROBE_EVERY_S):
            if store_answers(endpoint):
                seen, misses = True, 0
                if reported:
                    reported = False
                    with self._lock:
                        self._back.append(name)
                continue
            misses += 1
            if seen and misses == MISSES_BEFORE_LOST:
                reported = True
                with self._lock:
                    self._lost.append(name)

    def take_lost(self) -> list[str]:
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def take_back(self) -> list[str]:
        with self._lock:
            back, self._back = self._back, []
        return back

    def stop(self) -> None:
        self._stop.set()
