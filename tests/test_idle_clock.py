"""The idle rule is timed on a monotonic clock, not a host's wall clock (a VM's resume or chrony's
makestep steps that by an hour): the controller's clock as an attached run's usage line arrives
(deploy/edges/idle.py IdleWatcher), the agent's as a detached run's sample is taken
(deploy/host/idle.py HostSpell). Exact equality on the actions, samples as the agents send them."""

from __future__ import annotations

import json
from types import SimpleNamespace

from meshrun.deploy.edges.idle import IdleWatcher
from meshrun.deploy.host.idle import HostSpell
from meshrun.deploy.run.idle import IdlePolicy

POLICY = IdlePolicy(threshold=0.1, warn_s=600.0, stop_s=1800.0)  # --idle-stop 30
HOUR = 3600.0
WALL = 1_700_000_000.0  # the host's time of day as it starts


def found(wall: float, cpu: float) -> dict:
    """A usage sample as deploy/host/usage.busy gives it: one run process, no GPU."""
    return {"time": wall, "cpu_s": cpu, "procs": 1, "gpu_util": None, "per_pid": {"7": cpu}}


def watcher_actions(samples: list[tuple[float, float, float]]) -> tuple[list[str], list[tuple]]:
    """Feed (controller clock, host wall time, CPU s) lines to an IdleWatcher; what it said and told."""
    said: list[str] = []
    told: list[tuple] = []
    now = [0.0]
    watcher = IdleWatcher(POLICY, (SimpleNamespace(name="h1"),), said.append,  # type: ignore[arg-type]
                          lambda *a: told.append(a), clock=lambda: now[0])
    for clock, wall, cpu in samples:
        now[0] = clock
        watcher.feed("h1", json.dumps(found(wall, cpu)))
    return said, told


def test_a_host_clock_stepped_forward_an_hour_neither_warns_nor_stops_an_attached_run() -> None:
    """Idle samples 10 s apart, the host's clock stepped +1 h between two of them: 20 s of idling.
    (On the host's clock it was an hour: the old rule warned and stopped the run at once.)"""
    said, told = watcher_actions([(0, WALL, 5.0), (10, WALL + 10, 5.0), (20, WALL + HOUR + 20, 5.0),
                                  (30, WALL + HOUR + 30, 5.0)])
    assert (said, told) == ([], [])


def test_a_host_clock_stepped_back_an_hour_does_not_hold_the_stop_back() -> None:
    """Idle from the controller's 10 s on; the host's clock steps -1 h at 300 s: the warning comes
    at 610 s and the stop at 1810 s all the same, each told with the host's own time."""
    samples = [(float(t), WALL + t - (HOUR if t >= 300 else 0), 5.0) for t in range(0, 1821, 10)]
    said, told = watcher_actions(samples)
    assert told == [("h1", WALL + 610 - HOUR, 600.0, False), ("h1", WALL + 1810 - HOUR, 1800.0, True)]
    assert said == ["host 'h1' idle: its run's processes under 10% utilisation for 600 s while the run is "
                    "training; the run stops after 1800 s",
                    "stopping the run: host 'h1' idle for 1800 s (--idle-stop)"]


def test_a_busy_host_whose_clock_steps_forward_is_not_idle_for_a_moment_longer() -> None:
    """Busy on a core; the +1 h step makes one CPU share read tiny (1 s over an hour on the host's
    clock): a spell the next busy sample ends, never a warning."""
    said, told = watcher_actions([(0, WALL, 0.0), (10, WALL + 10, 10.0), (20, WALL + HOUR + 20, 20.0),
                                  (30, WALL + HOUR + 30, 30.0), (40, WALL + HOUR + 40, 40.0)])
    assert (said, told) == ([], [])


def test_a_detached_agent_times_its_host_on_its_monotonic_clock() -> None:
    """HostSpell, as HostIdle's thread feeds it: the sample's wall time steps +1 h, the agent's
    monotonic clock does not: nothing; steady idling then warns at 600 s and stops at 1800 s."""
    spell = HostSpell(POLICY, "h1")
    assert [spell.judge(found(wall, 5.0), at) for at, wall in [(0, WALL), (10, WALL + 10), (20, WALL + HOUR + 20)]] == [
        [], [], []]
    actions = [(at, a) for at in range(30, 1821, 10) for a in spell.judge(found(WALL + HOUR + at, 5.0), at)]
    assert actions == [
        (610, ("warn", "host 'h1' idle: its run's processes under 10% utilisation for 600 s while the run is "
                       "training; the run stops after 1800 s", 600.0)),
        (1810, ("stop", "host 'h1' idle for 1800 s (--idle-stop)", 1800.0))]


def test_a_detached_agent_measures_the_cpu_share_on_the_same_clock() -> None:
    """Busy on a core through a +1 h step of the wall clock: every share reads 1, no spell begins
    (on the wall clock, the stepped sample read 10 s of CPU over an hour: idle)."""
    spell = HostSpell(IdlePolicy(threshold=0.1, warn_s=10.0, stop_s=20.0), "h1")
    walls = [WALL, WALL + 10, WALL + 20 + HOUR, WALL + 30 + HOUR, WALL + 40 + HOUR]
    spells = []
    for i, wall in enumerate(walls):
        assert spell.judge(found(wall, 10.0 * i), 10.0 * i) == []
        spells.append(spell.state.since)
    assert spells == [None] * 5
