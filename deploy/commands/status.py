"""`fab status`: runs, hosts, state, epoch/step and uptime, read from the hosts' agents."""

from __future__ import annotations

from dataclasses import asdict

from meshrun.deploy.edges.agents import run_states
from meshrun.deploy.project import Project
from meshrun.deploy.errors import InputError
from meshrun.deploy.edges.records import all_records, live_records, load_record, no_runs
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.edges.watch import RunWatch
from meshrun.deploy.render.watch import watch as show
from meshrun.deploy.run.watchview import REFRESH_S


def main(run: str | None, as_json: bool, project: Project, watch: bool = False, frames: int = 0) -> None:
    """A named run, else every recorded run that may still be running: finished and stale runs
    are not asked about, so their hosts (perhaps long gone) are never contacted."""
    if frames and not watch:
        raise InputError("--frames counts the frames of --watch: add --watch, or leave --frames out")
    if watch:
        return _watch(resolve_run(project.runs, run, live_only=True), project, frames, as_json)
    renderer = Renderer()
    records = [load_record(project.runs, run)] if run else live_records(project.runs, renderer.warn)
    states = run_states(records, project.root)
    if as_json:
        renderer.json([asdict(s) for s in states])
    elif not records:
        recorded = all_records(project.runs)
        renderer.info(f"no run may still be running; name an older one with --run ID (the newest is {recorded[0].run_id})"
                      if recorded else no_runs(project.runs))
    else:
        renderer.run_states(states)


def _watch(record: RunRecord, project: Project, frames: int, as_json: bool = False) -> None:
    """`--watch`: the live view until Ctrl-C, which leaves the view and never touches the run;
    with `--json`, the same once (after two rounds of questions, so `busy` and samples/s have two answers):
    {"hosts": [its rows], "run": its line, "events": [{"time", "text"}]}."""
    watcher = RunWatch(record, project.root, project.runs)
    try:
        if as_json:
            found = watcher.snapshot(REFRESH_S)
            Renderer().json({"hosts": [asdict(r) for r in found.rows], "run": found.run,
                             "events": [{"time": at, "text": text} for at, text in zip(found.event_times, found.events)]})
            return
        show(f"run {record.run_id}", watcher.view, REFRESH_S, frames)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()
