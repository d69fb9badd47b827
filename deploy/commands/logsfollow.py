"""`fab logs -f`'s following: each host's `tail -F` read in a thread of its own, and a host whose
stream has been quiet a while pinged over its own session (`Session.ping`: a channel granted and
closed unused, as the launcher probes a training host).

A link that dies without a reset (a laptop asleep overnight, a Wi-Fi or VPN switched, a NAT that
forgot the connection) sends nothing and tells nobody: a read of the stream would wait for ever, and
the log would just stop, as if training hung (review longrun56, finding 2). Now a host that stops
answering is named in one line and no longer followed, while the others go on; a stream that ends
is said in one line too, and when no host is left to follow the command ends with status 1.

What to do when is decided by pure functions of the last-line times and the pings' answers
(`to_ping`, `answered`, …); the threads, the pings and the console are `Follower`'s."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from meshrun.deploy.edges.launcher import PING_TIMEOUT_S, PINGS_BEFORE_LOST
from meshrun.deploy.edges.sshexec import QUIET_BEFORE_PING_S
from meshrun.deploy.edges.transport import Session, Stream

TICK_S = 0.2  # how often the follower looks at its hosts (and at Ctrl-C)
AGAIN = "no more of its log will come: fab logs -f again once it is back"


@dataclass(frozen=True)
class Pace:
    """When a quiet host is pinged, and when it counts as gone. A stream quiet QUIET_BEFORE_PING_S (as
    a quiet command's host is pinged, deploy/edges/sshexec.py); then the launcher's ping timeout and
    misses in a row (deploy/edges/launcher.py), not a quiet command's shorter ones: a followed host is
    usually training, and its all-reduce keeps the link's queues full as it does for the launcher's
    probe. A cut link is said within about 12 + 2 x 6 = 24 s of the host's last word."""

    quiet_s: float = QUIET_BEFORE_PING_S
    ping_timeout_s: float = PING_TIMEOUT_S
    pings_before_lost: int = PINGS_BEFORE_LOST


PACE = Pace()


class End(enum.Enum):
    ENDED = "ended"  # its stream ended: its `tail -F` exited, or the connection was closed
    GONE = "gone"  # it stopped answering SSH: PINGS_BEFORE_LOST pings in a row unanswered


@dataclass(frozen=True)
class Followed:
    """One host's stream as the follower knows it."""

    heard: float  # monotonic: its last line, the start, or its last answered ping
    missed: int = 0  # pings in a row it did not answer
    asking: bool = False  # a ping is in flight (one at a time per host)
    end: End | None = None  # why it is no longer followed


def to_ping(hosts: Mapping[str, Followed], now: float, pace: Pace) -> list[str]:
    """The hosts still followed, quiet `pace.quiet_s` since last heard from, with no ping in flight:
    a host that prints as it goes is never pinged, and one that missed a ping is pinged again on the next look."""
    return [name for name, f in hosts.items()
            if f.end is None and not f.asking and now - f.heard >= pace.quiet_s]


def heard_line(f: Followed, now: float) -> Followed:
    """A line came: the link works."""
    return f if f.end is not None else replace(f, heard=now, missed=0)


def asking(f: Followed) -> Followed:
    return replace(f, asking=True)


def answered(f: Followed, alive: bool, now: float, pace: Pace) -> Followed:
    """A ping's answer: heard from, or one more miss; `pace.pings_before_lost` in a row and it is gone."""
    if f.end is not None:
        return replace(f, asking=False)
    if alive:
        return replace(f, heard=now, missed=0, asking=False)
    missed = f.missed + 1
    return replace(f, missed=missed, asking=False, end=End.GONE if missed >= pace.pings_before_lost else None)


def stream_ended(f: Followed) -> Followed:
    """Its stream ended; a host already gone stays gone (its stream ends when it is abandoned)."""
    return f if f.end is not None else replace(f, end=End.ENDED)


def newly_over(hosts: Mapping[str, Followed], said: set[str]) -> list[tuple[str, End]]:
    """The hosts no longer followed whose end has not been said yet, in order."""
    return [(name, f.end) for name, f in hosts.items() if f.end is not None and name not in said]


def end_line(host: str, end: End) -> str:
    """The one line that says a host is no longer followed, and why."""
    if end is End.GONE:
        return f"host '{host}' stopped answering SSH; {AGAIN}"
    return f"host '{host}': its log stream ended (its `tail -F` exited or the connection closed); {AGAIN}"


def none_left(run_id: str) -> str:
    return f"no host of run {run_id} is followed any more (see the lines above): fab logs -f again once they are back"


class Follower:
    """Follows `streams` (by host) until none is left or Ctrl-C. Lines go to `show(host, text)` from
    each stream's thread; what happens to a host is said with `warn`, from the calling thread only, so
    a stream's end is said after its last line. `sessions`: each host's, to ping it."""

    def __init__(self, streams: Mapping[str, Stream], sessions: Mapping[str, Session],
                 show: Callable[[str, str], None], warn: Callable[[str], None], pace: Pace | None = None) -> None:
        self.streams, self.sessions, self.show, self.warn = streams, sessions, show, warn
        self.pace = PACE if pace is None else pace
        now = time.monotonic()
        self.hosts = {name: Followed(now) for name in streams}
        self.said: set[str] = set()
        self.lock = threading.Lock()

    def run(self) -> bool:
        """Follow; True when stopped by Ctrl-C, False once no host is left. Every stream is abandoned."""
        for name in self.streams:
            threading.Thread(target=self._read, args=(name,), daemon=True, name=f"follow-{name}").start()
        try:
            while self._look():
                time.sleep(TICK_S)
            return False
        except KeyboardInterrupt:
            return True
        finally:
            for stream in self.streams.values():
                stream.abandon()

    def _change(self, name: str, change: Callable[[Followed], Followed]) -> None:
        with self.lock:
            self.hosts[name] = change(self.hosts[name])

    def _read(self, name: str) -> None:
        stream = self.streams[name]
        while raw := stream.readline():
            self._change(name, lambda f: heard_line(f, time.monotonic()))
            self.show(name, raw.decode(errors="replace").rstrip("\r\n"))
        self._change(name, stream_ended)

    def _ping(self, name: str) -> None:
        alive = self.sessions[name].ping(self.pace.ping_timeout_s)
        self._change(name, lambda f: answered(f, alive, time.monotonic(), self.pace))

    def _look(self) -> bool:
        """Say each end not said yet (a gone host's stream abandoned: its read would never end), ping
        the hosts quiet long enough; False when no host is left to follow."""
        with self.lock:
            pinged = to_ping(self.hosts, time.monotonic(), self.pace)
            for name in pinged:
                self.hosts[name] = asking(self.hosts[name])
            seen = dict(self.hosts)
        for name, end in newly_over(seen, self.said):
            self.said.add(name)
            self.warn(end_line(name, end))
            if end is End.GONE:
                self.streams[name].abandon()
        for name in pinged:
            threading.Thread(target=self._ping, args=(name,), daemon=True, name=f"ping-{name}").start()
        return any(f.end is None for f in seen.values())
