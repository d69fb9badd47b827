"""`fab stop`: TERM, grace, KILL on every host of a run, and proof that nothing is left. A host
that cannot be reached is named, and every other host is stopped all the same."""

from __future__ import annotations

from meshrun.layout import HEARTBEAT_TIMEOUT_S
from meshrun.deploy.edges.agents import run_states, stop_answers
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import RunRecord, resolve_live_run
from meshrun.deploy.render.console import Renderer


def main(run: str | None, project: Project) -> int:
    """Exit status 1 when a host of the run's latest attempt could not be reached, or a host still
    has run processes. A host only an earlier attempt used (`fab train --resume --hosts` left it
    out, often because it died) is tried too, and a warning when it cannot be reached. With no
    `run`, the one run that may still be running; several are refused, named (resolve_live_run).
    A host whose agent says the run was not running there is said to be so, never "stopped": with
    no `run`, an old detached run (which gets no summary) may be the one taken."""
    renderer = Renderer()
    record = resolve_live_run(project.runs, run, "fab stop", renderer.warn, lambda live: run_states(live, project.root))
    results = stop_answers(record, project.root, record.hosts)
    failed = tuple(h for h in results.failed if h not in record.earlier)
    for host in results:
        if host in results.failed:
            (renderer.error if host in failed else renderer.warn)(f"{host}: {results.failed[host]}")
        elif left := results.ok[host].pids:
            renderer.error(f"{host}: processes still alive: {list(left)}")
        elif results.ok[host].was_running is False:
            renderer.info(f"run {record.run_id} was not running on {host} (already ended)")
        else:
            renderer.info(f"{host}: clean, no process of run {record.run_id} left")
    if earlier := tuple(h for h in results.failed if h in record.earlier):
        renderer.warn(f"not reached: {', '.join(earlier)}, of an earlier attempt of run {record.run_id} (left out "
                      f"by --resume); if anything of the run is left there, run fab stop --run {record.run_id} "
                      "again once it answers")
    if failed:
        renderer.error(not_stopped(record, failed))
    if failed or any(answer.pids for answer in results.ok.values()):
        return 1
    renderer.info(stopped_line(record.run_id, {host: answer.was_running for host, answer in results.ok.items()}))
    return 0


def stopped_line(run_id: str, running: dict[str, bool | None]) -> str:
    """The last line of a clean stop: on how many of the hosts that answered ({host: was the run
    running there}, None: not said) the run was stopped, and where it had already ended. A host
    not reached is counted nowhere: no stop is claimed that did not happen."""
    stopped = [h for h, was in running.items() if was is not False]
    ended = ", ".join(h for h, was in running.items() if was is False)
    if not running:
        return f"run {run_id}: no host answered; nothing was stopped"
    if not stopped:
        return f"run {run_id} was not running on {ended}: nothing was stopped (it had already ended)"
    done = f"run {run_id} stopped on {len(stopped)} host(s)"
    return f"{done}; it was not running on {ended}" if ended else done


def not_stopped(record: RunRecord, hosts: tuple[str, ...]) -> str:
    """What becomes of the run on the hosts whose stop failed, and what to do."""
    names, again = ", ".join(hosts), "it answers" if len(hosts) == 1 else "they answer"
    if record.detached:  # its agents run with no controller and no heartbeat
        fate = ("a detached run's agent goes on there until its training ends, or until the run's "
                "--idle-stop rule, if it was started with one, stops it")
    else:
        fate = (f"its agent stops the run there by itself once the run's controller has been silent for "
                f"{HEARTBEAT_TIMEOUT_S} s, so ending the controller (Ctrl-C in its terminal) ends it too")
    return (f"run {record.run_id} was not stopped on {names} and may still be running there: {fate}; "
            f"run fab stop --run {record.run_id} again once {again}")
