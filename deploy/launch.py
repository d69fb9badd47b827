"""The edge that runs a launch plan: one agent per host, started in parallel, streamed live,
kept alive by heartbeats, and stopped everywhere on failure or Ctrl-C with proof that no run
process is left.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Mapping

from deploy.errors import MeshrunError
from deploy.fanout import on_each
from deploy.plan import HostLaunch, LaunchPlan, agent_verb_argv, host_dir
from deploy.transport import Session, Stream

HEARTBEAT_EVERY_S = 5.0
STOP_GRACE_S = 10.0
TAIL_LINES = 20

LineSink = Callable[[str, str], None]  # (host, line without newline)


class JobStatus(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class HostOutcome:
    host: str
    rc: int | None  # None: the connection was lost before an exit status came
    log: Path
    tail: tuple[str, ...]  # the last lines of everything the host printed
    remaining: tuple[int, ...] = ()  # run pids still alive after a stop (should be empty)
    stop_error: str | None = None
    worker_tail: tuple[str, ...] = ()  # the last lines its ranks printed (torchrun's own report excluded)


@dataclass(frozen=True)
class JobOutcome:
    run_id: str
    status: JobStatus
    started: float
    ended: float
    hosts: tuple[HostOutcome, ...]
    failed_host: str | None = None
    reason: str | None = None

    @property
    def duration_s(self) -> float:
        return self.ended - self.started


@dataclass
class _Live:
    """Mutable per-host state while the job runs; owned by JobRunner."""

    launch: HostLaunch
    session: Session
    log: Path
    stream: Stream | None = None
    rc: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    worker_tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))


class JobRunner:
    def __init__(self, plan: LaunchPlan, sessions: Mapping[str, Session], sink: LineSink, local_dir: Path,
                 local_python: str) -> None:
        self.plan = plan
        self.sink = sink
        self.local_python = local_python
        (local_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.hosts = [_Live(h, sessions[h.host.name], local_dir / "logs" / f"{h.host.name}.log") for h in plan.hosts]
        self.stopping = threading.Event()

    def run(self) -> JobOutcome:
        started = time.time()
        status, failed, reason = JobStatus.SUCCEEDED, None, None
        remaining: dict[str, object] = {}
        try:
            self._start_all()
            threading.Thread(target=self._heartbeats, daemon=True).start()
            failed = self._wait()
            if failed is not None:
                status, reason = JobStatus.FAILED, f"host '{failed}' exited with status {self._live(failed).rc}"
                remaining = self.stop_all()
        except KeyboardInterrupt:
            status, reason = JobStatus.STOPPED, "interrupted (Ctrl-C)"
            remaining = self.stop_all()
        return JobOutcome(self.plan.run_id, status, started, time.time(), self._outcomes(remaining), failed, reason)

    def _start_all(self) -> None:
        for live in self.hosts:
            live.stream = live.session.start(live.launch.agent)
            threading.Thread(target=self._read, args=(live,), daemon=True, name=f"log-{live.launch.host.name}").start()

    def _read(self, live: _Live) -> None:
        name = live.launch.host.name
        assert live.stream is not None
        with open(live.log, "a", encoding="utf-8") as log:
            while line := live.stream.readline():
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                if text.startswith(f"[{name}:"):
                    live.worker_tail.append(text)
                else:
                    text = f"[{name}] {text}"
                log.write(text + "\n")
                log.flush()
                live.tail.append(text)
                self.sink(name, text)
        live.rc = live.stream.wait(timeout=5)
        live.done.set()

    def _heartbeats(self) -> None:
        while not self.stopping.wait(HEARTBEAT_EVERY_S):
            for live in self.hosts:
                if live.stream is not None and not live.done.is_set():
                    live.stream.send(b"\n")

    def _wait(self) -> str | None:
        """Block until every host is done (None) or one fails (its name)."""
        while True:
            for live in self.hosts:
                if live.done.is_set() and live.rc != 0:
                    return live.launch.host.name
            if all(live.done.is_set() for live in self.hosts):
                return None
            time.sleep(0.2)

    def stop_all(self) -> dict[str, object]:
        """Stop the run on every host and confirm it. Returns {host: remaining pids or error}."""
        self.stopping.set()
        for live in self.hosts:
            if live.stream is not None:
                live.stream.close_stdin()  # the agent reads EOF as "controller gone" and stops too
        by_name = {live.launch.host.name: live for live in self.hosts}
        while True:
            try:
                return on_each([live.launch.host for live in self.hosts],
                               lambda h: self._stop_host(by_name[h.name]), timeout=STOP_GRACE_S + 30)
            except KeyboardInterrupt:
                continue  # a second Ctrl-C must not leave hosts half-stopped

    def _stop_host(self, live: _Live) -> tuple[int, ...]:
        host = live.launch.host
        argv = agent_verb_argv(host, "stop", self.plan.run_id, self.local_python, STOP_GRACE_S)
        result = live.session.run(argv, timeout=STOP_GRACE_S + 25)
        try:
            report = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise MeshrunError(f"host '{host.name}': stop gave no report (rc {result.rc}): {result.stderr.strip()[-200:]}")
        return tuple(report.get("remaining", ()))

    def _live(self, name: str) -> _Live:
        return next(live for live in self.hosts if live.launch.host.name == name)

    def _outcomes(self, remaining: Mapping[str, object]) -> tuple[HostOutcome, ...]:
        outcomes = []
        for live in self.hosts:
            live.done.wait(timeout=5)
            left = remaining.get(live.launch.host.name, ())
            error = str(left) if isinstance(left, MeshrunError) else None
            pids = tuple(left) if isinstance(left, tuple) else ()
            outcomes.append(HostOutcome(live.launch.host.name, live.rc, live.log, tuple(live.tail), pids, error,
                                        tuple(live.worker_tail)))
        return tuple(outcomes)


def remote_log_path(run_id: str, host: str) -> str:
    return f"{host_dir(run_id, host)}/train.log"
