"""The idle rule's samples on a host (common/idlerule.py).

A detached run's agent applies the rule to its own host (`HostIdle`): a thread samples how busy
the run is here every few seconds and queues what the rule says; the agent journals and prints it,
sends it (this host's own event: its agent sends it, whichever host holds the rendezvous), and on
`stop` ends its part of the run. The policy comes from the controller on argv (`--idle`, JSON:
nothing secret). It is timed on the agent's monotonic clock (`HostSpell`), not this host's wall
clock, which a VM's resume or chrony's makestep can step by an hour.

An attached run's agent only samples (`UsageFeed`, `--usage-every`): one line to the controller
every few seconds, which applies the rule (deploy/edges/idle.py). Sampling in the agent, which
runs anyway, costs a read of /proc (about a millisecond); the controller starting a python on
every host every 10 s for it cost 24 CPU-s in a 106 s launch of 32 test-bed hosts, a fifth of a
core, while the hosts were still importing torch (docs/scale.md)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Callable

from meshrun.layout import AGENT_USAGE_PREFIX
from meshrun.deploy.host.usage import busy, newest_checkpoint
from meshrun.idlerule import IdlePolicy, IdleState, Usage, step, utilisation, warning


def sample_of(found: dict) -> Usage:
    gpus = found["gpu_util"]
    return Usage(found["time"], found["cpu_s"], found["procs"], tuple(gpus) if gpus else None,
                 tuple(sorted((int(pid), cpu) for pid, cpu in found["per_pid"].items())))


class HostSpell:
    """The rule over this host's samples in turn. Each is judged at `at`, the agent's monotonic
    clock when it was taken, for the spell and for the CPU share alike: the sample's own `time` is
    this host's wall clock, and a step of it (+1 h) would warn and stop at once, or (-1 h) hold a
    stop back an hour. Nothing here shows or records a time of day, only seconds idle."""

    def __init__(self, policy: IdlePolicy, host: str) -> None:
        self.policy, self.host = policy, host
        self.state, self.last = IdleState(), None

    def judge(self, found: dict, at: float) -> list[tuple[str, str, float]]:
        """("warn" | "stop", text for the agent's journal, seconds idle) for what `found` triggers."""
        now = dataclasses.replace(sample_of(found), time=at)
        before, self.last = self.last, now
        util = utilisation(before, now) if before is not None else None
        actions = []
        for action in step(self.state, self.policy, at, util):
            idle_s = at - (self.state.since if self.state.since is not None else at)
            text = (warning(self.host, self.state, self.policy, at, bool(now.gpu_util)) if action == "warn"
                    else f"host '{self.host}' idle for {idle_s:.0f} s (--idle-stop)")
            actions.append((action, text, idle_s))
        return actions


class HostIdle:
    """Actions for the agent's loop: ("warn" | "stop", text for its journal, seconds idle)."""

    def __init__(self, policy: IdlePolicy, run_id: str, host: str) -> None:
        self.policy, self.run_id, self.host = policy, run_id, host
        self.spell = HostSpell(policy, host)
        self._actions: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="meshrun-idle", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(self.policy.sample_s):
            found = busy(self.run_id, self.host)[0]
            actions = self.spell.judge(found, time.monotonic())  # read as the sample is taken
            with self._lock:
                self._actions.extend(actions)

    def take(self) -> list[tuple[str, str, float]]:
        with self._lock:
            actions, self._actions = self._actions, []
        return actions

    def stop(self) -> None:
        self._stop.set()


class UsageFeed:
    """Every `every_s` seconds, one `AGENT_USAGE_PREFIX` line with the idle rule's sample and the
    newest checkpoint step here, handed to `send` (the agent's stream to the controller)."""

    def __init__(self, every_s: float, run_id: str, host: str, send: Callable[[bytes], None]) -> None:
        self.every_s, self.run_id, self.host, self.send = every_s, run_id, host, send
        self._stop = threading.Event()
        threading.Thread(target=self._feed, name="meshrun-usage", daemon=True).start()

    def line(self) -> bytes:
        sample = {**busy(self.run_id, self.host)[0], "checkpoint": newest_checkpoint(self.run_id)}
        return f"{AGENT_USAGE_PREFIX}{json.dumps(sample, separators=(',', ':'))}\n".encode()

    def _feed(self) -> None:
        while not self._stop.wait(self.every_s):
            self.send(self.line())

    def stop(self) -> None:
        self._stop.set()
