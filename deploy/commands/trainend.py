"""The end of an attached `fab train`: what the hosts answer once the job has ended (the trainer's
result.json, else the hosts' start counts, the comm record, provenance, the newest checkpoint),
read into the run's summary."""

from __future__ import annotations

from typing import Mapping

from meshrun.layout import RESULT, STARTS_FILE, run_dir
from meshrun.deploy.edges.checkpointpush import hosts_newest_step
from meshrun.deploy.edges import comm as comm_cmd
from meshrun.deploy.edges.sessions import first_found, reachable_results
from meshrun.deploy.edges import provenance
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.neutral import one_line
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchPlan
from meshrun.deploy.run.summary import STARTS_READ_MAX, RunSummary, build_summary, host_starts, trainer_result


def last_checkpoint(sessions: Mapping[str, Session], plan: LaunchPlan, lost: str) -> str:
    """Where the newest checkpoint is, for the message after an elastic run fell below its minimum:
    every host keeps its own verified copies, so any reachable host's manifest tells."""
    names = [h.host.name for h in plan.hosts]
    newest = hosts_newest_step(sessions, names, plan.run_id)
    if newest < 0:
        return (f"no reachable host lists a checkpoint; once {lost} is back: fab fetch-checkpoints --run "
                f"{plan.run_id}, then fab train --resume {plan.run_id}")
    return (f"last checkpoint: step {newest}, held by the hosts still reachable; resume with "
            f"fab train --resume {plan.run_id}")


def script_resume_hint(run_id: str) -> str:
    """After an elastic --script run fell below its minimum: meshrun keeps no checkpoint of a script's."""
    return (f"resume with fab train --resume {run_id} once enough hosts answer: your script starts again on "
            f"them and reloads what it saved under $MESHRUN_RUN_DIR there (docs/scripts.md)")


RESULT_TIMEOUT_S = 20  # each host's answer after the run: result.json, or its start count


def read_result(sessions: Mapping[str, Session], plan: LaunchPlan) -> dict | None:
    """The trainer's result.json, from whichever host ran rank 0."""
    names = [h.host.name for h in plan.hosts]
    return first_found(sessions, names, ["cat", f"{run_dir(plan.run_id)}/{RESULT}"], RESULT_TIMEOUT_S,
                       lambda result: trainer_result(result.stdout))


def read_starts(sessions: Mapping[str, Session], plan: LaunchPlan, rdzv_id: str, script: bool = True) -> list[int]:
    """The launch's worker-group starts as each answering host counted them in starts.json: a --script
    run's runner's own count on that host (deploy/host/runscript.py; hosts sharing a workdir share the
    file), or, `script` False, the count the trainer's ranks agreed (train/starts.py), read only when
    no result.json holds it: every host at once, one bounded read each; a host that does not answer,
    or answers out of shape, counts no start."""
    names = [h.host.name for h in plan.hosts]
    argv = ["head", "-c", str(STARTS_READ_MAX + 1), f"{run_dir(plan.run_id)}/{STARTS_FILE}"]
    counts = (host_starts(result.stdout, rdzv_id, name if script else None) if result.ok else None
              for name, result in reachable_results(sessions, names, argv, RESULT_TIMEOUT_S))
    return [n for n in counts if n is not None]


def gathered(plan: LaunchPlan, outcome: JobOutcome, record: RunRecord, sessions: Mapping[str, Session],
              project: Project, renderer: Renderer, origin: Beside[dict]) -> RunSummary:
    """The summary with what the hosts answer after the job: the trainer's result, the comm record
    and provenance; the last checkpoint's hint after an elastic failure."""
    lost = outcome.unreachable()
    answering = {name: session for name, session in sessions.items() if name not in lost}
    if outcome.status is JobStatus.FAILED and plan.elastic is not None and outcome.failed_host:
        renderer.info(last_checkpoint(answering, plan, outcome.failed_host) if not record.workload.get("script")
                      else script_resume_hint(plan.run_id))
    saved_plan = comm_cmd.load_plan(project.runs, plan.run_id)
    measured = comm_cmd.read_comm_record(answering, plan) if saved_plan else None
    comm = comm_cmd.beside_floor(saved_plan, measured and measured["comm_s"]) if saved_plan else None
    names = [h.host.name for h in plan.hosts]
    made = launched(origin, renderer)
    if made is not None:
        made = {**made, **provenance.at_end(answering, names, plan.run_id, saved_plan)}
    rdzv_id = record.rdzv_id or plan.run_id
    if record.workload.get("script"):
        # A script writes no result.json (docs/scripts.md): its hosts' round is the start counts instead.
        return build_summary(plan, outcome, None, comm, made, starts=read_starts(answering, plan, rdzv_id))
    result = read_result(answering, plan)
    # result.json is written at success only: a failed or stopped trainer run's restarts (torchrun's
    # restarts of failed workers among them, which no timeline shows) are in its hosts' starts.json.
    starts = read_starts(answering, plan, rdzv_id, script=False) if "restarts" not in (result or {}) else []
    return build_summary(plan, outcome, result, comm, made, starts=starts)


def launched(origin: Beside[dict], renderer: Renderer) -> dict | None:
    """The provenance read while the agents started, or None (said) when that reading failed: the run
    has ended, and its summary.json must be written whatever a host answered then."""
    try:
        return origin.result()
    except MeshrunError as err:
        renderer.warn(f"the run's provenance is not in its summary: {one_line(str(err))}")
        return None
