"""`fab train --detach`'s start: each host's agent started in the background, where it outlives
this controller by design. All at once; a Ctrl-C starts no more, waits for those in flight, and
the caller stops the hosts whose agents had started (a Ctrl-C there is meant to start nothing:
before, the starts went on after it and the hosts trained on, holding their GPUs, unsaid), and
those whose start failed but whose agent may yet run (a copy slow past its window, an answer lost
on a dropped link). A second Ctrl-C does not cut that stop short."""

from __future__ import annotations

import threading
from typing import Mapping

from meshrun.deploy.edges.agents import detached_answer, run_detached_agent, stop_hosts
from meshrun.deploy.edges.fanout import HostResults, start_each
from meshrun.deploy.edges.launcher import NOT_CUT_SHORT
from meshrun.deploy.edges.records import load_record
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run import notify
from meshrun.deploy.run.answers import AgentBusy, detached_failure, detached_record
from meshrun.deploy.run.plan import HostLaunch, LaunchPlan
from meshrun.deploy.stopsignals import interrupts_while


class StartInterrupted(KeyboardInterrupt):
    """Ctrl-C during a detached start, once the starts in flight ended: `started` names the hosts
    whose agents run (each outlives this controller by design, so the caller stops them), and
    `unsure` those whose start failed, busy hosts aside (another start's agent runs there): a failed
    start may still leave an agent that starts later, and a stop by run id where none runs is harmless."""

    def __init__(self, started: tuple[str, ...], unsure: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.started = started
        self.unsure = unsure


def start_detached(plan: LaunchPlan, sessions: Mapping[str, Session], urls: tuple[str, ...] = (),
                   every_checkpoint: bool = False) -> None:
    """Start each host's agent in the background; it outlives this controller by design. With receivers,
    the agents send the run's events (the rendezvous host's agent alone: deploy/host/notify.py). All
    at once; a Ctrl-C starts no more and waits for those in flight (StartInterrupted names them)."""
    names = [h.host.name for h in plan.hosts]
    head = next(h.host.name for h in plan.hosts if h.is_rendezvous_host)
    started: dict[str, dict] = {}
    failed: dict[str, MeshrunError] = {}

    def start(launch: HostLaunch) -> None:
        host = launch.host
        block = notify.agent_block(dict(host.env), urls, head, names, every_checkpoint)
        try:  # a host that does not answer in time, or whose link drops, fails alone: the others go on
            result = run_detached_agent(sessions[host.name], launch, block=block)
            started[host.name] = detached_record(host.name, detached_answer(result))
        except MeshrunError as err:
            failed[host.name] = err

    try:
        start_each(plan.hosts, start)
    except KeyboardInterrupt:
        unsure = tuple(n for n in names if n in failed and not isinstance(failed[n], AgentBusy))
        raise StartInterrupted(tuple(n for n in names if n in started), unsure) from None
    if failed:
        raise MeshrunError(detached_failure(plan.run_id, {n: failed[n] for n in names if n in failed}))


def stop_started(run_id: str, started: tuple[str, ...], project: Project, renderer: Renderer,
                 unsure: tuple[str, ...] = ()) -> None:
    """A Ctrl-C during a detached start is meant to start nothing: stop what had started already, and
    where a start failed without a busy answer. A second Ctrl-C (SIGTERM, SIGHUP) is noted, never
    raised: it used to end the stop's fan-out before it reached the hosts, which trained on, unsaid."""
    names = started + tuple(n for n in unsure if n not in started)
    if not names:
        return
    stopping = threading.Event()
    stopping.set()  # every signal from now on is noted: the stop is what it would interrupt

    def noted(_signum: int, _raised: bool) -> None:  # said beside: the signal may find us holding the console
        threading.Thread(target=renderer.warn, daemon=True,
                         args=(f"still stopping run {run_id} on {', '.join(names)}; {NOT_CUT_SHORT}",)).start()

    put_back = interrupts_while(stopping, noted)
    try:
        renderer.warn(f"interrupted: stopping run {run_id} on {_whom(started, unsure)}; {NOT_CUT_SHORT}")
        left = stop_hosts(load_record(project.runs, run_id, "--run"), project.root, names)
    finally:
        put_back()
    if unclean := _unclean(left):
        renderer.warn(f"not every host of run {run_id} is clean ({unclean}): fab stop --run {run_id}")


def _whom(started: tuple[str, ...], unsure: tuple[str, ...]) -> str:
    """The hosts a stop after a Ctrl-C reaches, by why."""
    parts = [f"{', '.join(started)}, whose agents had started"] if started else []
    if rest := [n for n in unsure if n not in started]:
        parts.append(f"{', '.join(rest)}, whose start failed (an agent may still start there)")
    return " and ".join(parts)


def _unclean(left: HostResults[tuple[int, ...]]) -> str:
    """Which hosts' stops failed, and where processes outlived one; empty when every host is clean."""
    parts = [f"stop failed: {err}" for err in left.failed.values()]
    parts += [f"host '{name}': processes left: {', '.join(map(str, pids))}" for name, pids in left.ok.items() if pids]
    return "; ".join(parts)
