"""`fab train --detach`'s start: each host's agent started in the background, where it outlives
this controller by design. All at once; a Ctrl-C starts no more, waits for those in flight, and
the caller stops the hosts whose agents had started (a Ctrl-C there is meant to start nothing:
before, the starts went on after it and the hosts trained on, holding their GPUs, unsaid)."""

from __future__ import annotations

from typing import Mapping

from meshrun.deploy.edges.agents import detached_answer, run_detached_agent, stop_hosts
from meshrun.deploy.edges.fanout import start_each
from meshrun.deploy.edges.records import load_record
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run import notify
from meshrun.deploy.run.answers import detached_failure, detached_record
from meshrun.deploy.run.plan import HostLaunch, LaunchPlan


class StartInterrupted(KeyboardInterrupt):
    """Ctrl-C during a detached start, once the starts in flight ended: `started` names the hosts
    whose agents run (each outlives this controller by design, so the caller stops them)."""

    def __init__(self, started: tuple[str, ...]) -> None:
        super().__init__()
        self.started = started


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
        raise StartInterrupted(tuple(n for n in names if n in started)) from None
    if failed:
        raise MeshrunError(detached_failure(plan.run_id, {n: failed[n] for n in names if n in failed}))


def stop_started(run_id: str, started: tuple[str, ...], project: Project, renderer: Renderer) -> None:
    """A Ctrl-C during a detached start is meant to start nothing: stop what had started already."""
    if not started:
        return
    renderer.warn(f"interrupted: stopping run {run_id} on {', '.join(started)}, whose agents had started")
    left = stop_hosts(load_record(project.runs, run_id, "--run"), project.root, started)
    if left.failed or any(left.values()):
        renderer.warn(f"not every host of run {run_id} is clean: fab stop --run {run_id}")
