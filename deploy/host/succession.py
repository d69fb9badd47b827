"""Rendezvous succession on a host: watch the current rendezvous host's c10d store, and say when it
is gone so the agent can move its run to the next generation (docs/elastic.md).

torchrun's store lives on one host; when that host is killed or cut off, the survivors' torchrun
cannot re-rendezvous. Every agent therefore probes the store of the current generation's host
with a plain TCP connect. A killed host refuses at once; a cut one times out. Two misses in a row,
after the store was seen up once, mean it is lost. A store never seen up gets a start-up grace
instead (its host may still be importing torch). A connect that is merely slow is not a miss: the
run's own all-reduce fills both uplinks, so on a home or cross-continent link the handshake queues
behind it (see CONNECT_TIMEOUT_S). Standard library only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

PROBE_EVERY_S = 2.0  # the pause between one probe's end and the next one's start: probes never overlap
# One probe's connect. The SYN waits in this host's saturated uplink and the SYN-ACK in the store
# host's, behind the run's own all-reduce: up to ~2.5 s of queueing plus a 300 ms RTT. Linux resends
# a SYN that a full queue dropped after 1 s (then 3 s): 6 s covers that one resend plus the queueing
# (1 + 2.8 s). 2 s counted a live host behind a busy link as gone, and the agent then killed healthy
# workers and split the run (two generations at once).
CONNECT_TIMEOUT_S = 6.0
MISSES_BEFORE_LOST = 2
# Worst case from a cut (no reset) to `lost`: each miss costs a pause and a full timeout, counted
# from the last probe that answered: 2 x (2 + 6) = 16 s (it was 8 s with a 2 s timeout). A killed
# host refuses at once: about MISSES_BEFORE_LOST x PROBE_EVERY_S = 4 s, as before.
LOST_WITHIN_S = MISSES_BEFORE_LOST * (PROBE_EVERY_S + CONNECT_TIMEOUT_S)
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


def store_answers(endpoint: str, timeout: float | None = None) -> bool:
    """A TCP connect to `endpoint` completes within `timeout` (default CONNECT_TIMEOUT_S)."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout or CONNECT_TIMEOUT_S):
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
        """After torchrun failed by itself: is its rendezvous host gone (two probes in a row, each
        as patient as the watcher's: at most 2 x CONNECT_TIMEOUT_S = 12 s for a cut host)?"""
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
