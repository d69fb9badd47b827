"""`fab status`: runs, hosts, state, epoch/step and uptime, read from the hosts' agents; a run that
ended with the controller's summary.json also says what it recorded (its hosts may be long gone)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from meshrun.deploy.edges.agents import run_states
from meshrun.deploy.project import Project
from meshrun.deploy.errors import InputError
from meshrun.deploy.edges.records import ENDED, all_records, live_records, load_record, no_runs, own_summary
from meshrun.deploy.run.answers import MISSING, said
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.records import RunRecord, resolve_run
from meshrun.deploy.edges.watch import RunWatch
from meshrun.deploy.render.watch import watch as show
from meshrun.deploy.run.watchview import REFRESH_S


def main(run: str | None, as_json: bool, project: Project, watch: bool = False, frames: int = 0) -> None:
    """A named run, else every recorded run that may still be running (records.live_records): an
    attached run that ended (its summary.json, or its controller gone past the heartbeat timeout) is
    not asked about, so its hosts (perhaps long gone) are never contacted. A detached run gets no
    summary: each one ever started here is asked about until its folder is removed from the runs dir,
    and shows as `exited`/`stopped` (or `unreachable`, once its hosts are gone) in every status.
    A named run that ended with a summary shows what it recorded under its hosts' states (text only:
    `--json` keeps its rows; summary.json is the file to read)."""
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
        ended = {r.run_id: outcome for r in records if (outcome := summary_outcome(project.runs / r.run_id, r.run_id))}
        renderer.run_states(states, ended)


def summary_outcome(run_path: Path, run_id: str) -> str | None:
    """What the controller's summary.json in `run_path` recorded of `run_id` (`recorded_outcome`);
    None when there is none (a detached run, one not ended, a file that cannot be read)."""
    found = own_summary(run_path, run_id)
    return recorded_outcome(found, run_id) if found is not None else None


def recorded_outcome(summary: object, run_id: str) -> str | None:
    """`succeeded`, or `failed (its reason)`: the status of a summary.json of `run_id` with one of
    meshrun's statuses (records.has_own_summary's test: a script's file of that name is no end), its
    reason quoted as a host's text is (it can name what a host said). Else None."""
    if not isinstance(summary, dict) or summary.get("run_id") != run_id:
        return None
    status, reason = summary.get("status"), summary.get("reason", MISSING)
    if not isinstance(status, str) or status not in ENDED:
        return None
    return f"{status} ({said(reason)})" if isinstance(reason, str) and reason.strip() else status


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
