"""Host clocks against each other, pure: an elastic run regroups only while they agree within seconds.

torch's c10d dynamic rendezvous (torch 2.14.1: torch/distributed/elastic/rendezvous/dynamic_rendezvous.py)
stamps each node's heartbeat with that node's own wall clock (`_keep_alive`: `datetime.now(timezone.utc)`),
and each node drops every participant whose stamp looks older, on its own clock, than keep_alive_interval x
keep_alive_max_attempt (`_sanitize`). A heartbeat is renewed once an interval (`_should_keep_alive`), so it
may be an interval old already when read. meshrun's elastic runs set 2 s x 3 (deploy/run/plan.py's
ELASTIC_RDZV_CONF): hosts whose clocks are more than 6 - 2 = 4 s apart can drop each other from a round,
the one ahead dropping the one behind, even from a round that completed. Their agents then start workers
with different world sizes, and the run's first regroup after a host is lost or back, or a `fab join`,
fails with store timeouts that name no clock.

The facts probe prints the host's time.time() and how long it had run by then; the controller notes its
own wall clock as it asks and as the answer is in (deploy/edges/host_queries.timed_run). The host read its
clock inside that window, after it had run that long: its offset from this machine is taken at the
window's middle and known within half the window (`reading`).

The rendezvous compares the hosts' clocks with each other; this machine's takes no part. So the verdict
is on pairs of hosts, each pair blamed on the one farther from the median of all the clocks, this
machine's included: a host that is off alone is named, not its honest peers, and a controller that is
off alone is no finding. A pair certainly past the margin is a FAIL for an elastic run (a WARN for
another); one from NEAR_S apart is a WARN, since clocks without time sync drift apart by seconds a day.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping

from meshrun.deploy.check.findings import Finding, fail, warn
from meshrun.deploy.run.plan import ELASTIC_RDZV_CONF

NEAR_S = 1.0  # hosts this far apart are warned of: 20-50 ppm of drift is 2-4 s a day
SYNC = "sync the clocks (timedatectl set-ntp true, or chrony)"


@dataclass(frozen=True)
class Slack:
    """How old, on a node's own clock, a peer's heartbeat may look before the rendezvous drops it."""

    interval_s: float  # each node renews its heartbeat this often
    attempts: int

    @property
    def expiry_s(self) -> float:
        return self.interval_s * self.attempts

    @property
    def margin_s(self) -> float:
        """How far apart two hosts' clocks may be: a heartbeat read may be an interval old already."""
        return self.expiry_s - self.interval_s


def slack_of(conf: tuple[str, ...] = ELASTIC_RDZV_CONF) -> Slack:
    """The keep-alive settings of a `--rdzv-conf` list of `key=value` items."""
    values = dict(item.partition("=")[::2] for item in conf)
    return Slack(float(values["keep_alive_interval"]), int(values["keep_alive_max_attempt"]))


ELASTIC_SLACK = slack_of()  # what an elastic run's torchruns are given (deploy/run/plan.torchrun_argv)


@dataclass(frozen=True)
class Clock:
    """A host's clock against this machine's: `offset_s` > 0 runs ahead, within ± `uncertainty_s`."""

    offset_s: float
    uncertainty_s: float


@dataclass(frozen=True)
class NoClock:
    """Why a host's answer gave no clock that can be one (deploy/check/answers.clock_of)."""

    error: str


def reading(sent_at: float, answered_at: float, host_clock: float, ran_s: float) -> Clock:
    """The host read `host_clock` between `sent_at` + `ran_s` (it had run that long, by its own monotonic
    clock) and `answered_at`, both on this machine's wall clock. A `ran_s` longer than the whole round
    trip is no honest one: the window is then the round trip."""
    end = max(sent_at, answered_at)
    start = sent_at + (ran_s if 0.0 <= ran_s <= end - sent_at else 0.0)
    return Clock(host_clock - (start + end) / 2, (end - start) / 2)


def apart_s(a: Clock, b: Clock) -> float:
    """How far apart two read clocks certainly are: their offsets' distance less both uncertainties."""
    return max(0.0, abs(a.offset_s - b.offset_s) - a.uncertainty_s - b.uncertainty_s)


def to_blame(a: Clock, b: Clock, median: float) -> bool:
    """Whether `a` is to blame for being apart from `b`: it is farther from the median of all the clocks,
    or as far as the readings can tell (then both are)."""
    return abs(a.offset_s - median) + a.uncertainty_s + b.uncertainty_s >= abs(b.offset_s - median)


def clock_findings(clocks: Mapping[str, Clock | NoClock | None], elastic: bool,
                   slack: Slack = ELASTIC_SLACK) -> list[Finding]:
    """Per host, in `clocks`' order: one whose clock is too far from another host's, or whose answer gave
    no clock (unchecked, a WARN). None: not read (an unreachable host, a python that did not run: said
    elsewhere). One host alone has no peer to disagree with."""
    if len(clocks) < 2:
        return []
    read = {name: clock for name, clock in clocks.items() if isinstance(clock, Clock)}
    median = statistics.median([0.0, *(r.offset_s for r in read.values())])
    found = []
    for name, clock in clocks.items():
        if isinstance(clock, NoClock):
            found.append(warn(name, f"its clock could not be read ({clock.error}): whether it is within "
                                    f"{slack.margin_s:g} s of the other hosts' clocks, which an elastic run's "
                                    "regroup needs, is unknown"))
        elif isinstance(clock, Clock) and (partner := _partner(name, read, median)) is not None:
            found.append(_pair_finding(name, read, partner, elastic, slack))
    return found


def _partner(name: str, read: Mapping[str, Clock], median: float) -> str | None:
    """The host `name`'s clock is farthest from, of those it is to blame for being NEAR_S apart from."""
    mine = read[name]
    blamed = [(apart_s(mine, r), other) for other, r in read.items() if other != name and to_blame(mine, r, median)]
    far = max(blamed, key=lambda pair: pair[0], default=None)
    return None if far is None or far[0] < NEAR_S else far[1]


def _pair_finding(name: str, read: Mapping[str, Clock], partner: str, elastic: bool,
                  slack: Slack) -> Finding:
    mine, theirs = read[name], read[partner]
    here = (f"within {_bound(mine.uncertainty_s)} of this machine's" if abs(mine.offset_s) <= mine.uncertainty_s
            else f"{_side(mine.offset_s)} this machine's (±{_bound(mine.uncertainty_s)})")
    said = f"its clock is {here} and {_side(mine.offset_s - theirs.offset_s)} host {partner}'s"
    drops = f"an elastic run's rendezvous drops a host whose heartbeats look older than {slack.expiry_s:g} s"
    if apart_s(mine, theirs) > slack.margin_s:
        return (fail if elastic else warn)(name, f"{said}: {drops}, so it cannot regroup after a host is lost; {SYNC}")
    return warn(name, f"{said}: {drops}, and one may be {slack.interval_s:g} s old when read, so clocks past "
                      f"{slack.margin_s:g} s apart can be dropped; clocks without time sync drift apart by seconds "
                      f"a day; {SYNC}")


def _side(offset_s: float) -> str:
    return f"{_duration(abs(offset_s))} {'ahead of' if offset_s > 0 else 'behind'}"


def _bound(seconds: float) -> str:
    """An uncertainty, rounded up to the tenth: still a bound."""
    return f"{math.ceil(round(seconds * 10, 9)) / 10:.1f} s" if seconds < 120 else _duration(seconds)


def _duration(seconds: float) -> str:
    """Seconds to the tenth under 2 min; a clock reset to 1970 is best said in days."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.1f} s"
