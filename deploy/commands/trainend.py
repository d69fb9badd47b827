"""The end of an attached `fab train`: what the hosts answer once the job has ended (the trainer's
result.json, else the hosts' start counts and rank 0's progress and epochs; the agents' exit records;
the comm record, provenance, the newest checkpoint), read into the run's summary."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from meshrun.layout import RESULT, run_dir
from meshrun.deploy.edges.checkpointpush import hosts_newest_step
from meshrun.deploy.edges import comm as comm_cmd
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.sessions import first_found
from meshrun.deploy.edges import provenance
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.transport import CommandResult, Session
from meshrun.deploy.edges.watch import tail
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.render.neutral import one_line
from meshrun.deploy.run.alone import ALONE_READ, AloneRank, trained_alone
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchPlan
from meshrun.deploy.run.summary import HostEnd, RunSummary, build_summary, end_files, end_read, host_end, trainer_result


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


RESULT_TIMEOUT_S = 20  # each host's answer after the run: result.json, or its end's files (`read_ends`)
EPOCHS_OVERRIDE = "epochs="  # the built-in trainer's override of the epochs to train (train/config.py)


def configured_epochs(args: object) -> int | None:
    """The epochs a built-in trainer run was to train, where the run's overrides say (`-- epochs=N`; the
    last wins, as the trainer applies them): a record of a later epoch is none of this run's. None where
    they do not say (its config file's: the controller never imports the trainer to read it) or say it
    in another form than plain digits (YAML's `1_000`, `0o10`): no bound then, rather than a wrong one."""
    words = [a for a in args if isinstance(a, str)] if isinstance(args, (list, tuple)) else []
    given = [w.removeprefix(EPOCHS_OVERRIDE) for w in words if w.startswith(EPOCHS_OVERRIDE)]
    value = given[-1] if given else ""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 and value == str(int(value)) else None


def read_result(sessions: Mapping[str, Session], plan: LaunchPlan) -> dict | None:
    """The trainer's result.json, from whichever host ran rank 0."""
    names = [h.host.name for h in plan.hosts]
    return first_found(sessions, names, ["cat", f"{run_dir(plan.run_id)}/{RESULT}"], RESULT_TIMEOUT_S,
                       lambda result: trainer_result(result.stdout))


def read_ends(sessions: Mapping[str, Session], plan: LaunchPlan, rdzv_id: str, script: bool,
              trainer: bool = False) -> list[HostEnd]:
    """What each answering host's files say after the run, in one bounded read per host, every host at
    once (`end_files`, `end_read`): its count of the launch's worker-group starts in starts.json (a
    --script run's runner's own count on that host, `script`: deploy/host/runscript.py; else the count
    the trainer's ranks agreed, train/starts.py), why its agent ended (exit.json: this controller's
    silence), and, `trainer` (no result.json holds them), rank 0's progress.json and metrics.jsonl.
    A host that does not answer adds nothing; one that answers out of shape, only its sound parts.
    Each file is read from its end: tail exits 1 where one is missing, and the others still count."""
    asked = [sessions[h.host.name].host for h in plan.hosts if h.host.name in sessions]
    files = {host.name: end_files(plan.run_id, host.name, trainer) for host in asked}

    def ask(host: Host) -> CommandResult:
        return sessions[host.name].run(end_read(files[host.name]), timeout=RESULT_TIMEOUT_S)

    answers = on_each(asked, ask, timeout=RESULT_TIMEOUT_S + 5).ok
    return [host_end(name, answers[name].stdout, files[name], rdzv_id, script) for name in files if name in answers]


def gathered(plan: LaunchPlan, outcome: JobOutcome, record: RunRecord, sessions: Mapping[str, Session],
              project: Project, renderer: Renderer, origin: Beside[dict]) -> RunSummary:
    """The summary with what the hosts answer after the job: the trainer's result, else their end's
    files (`read_ends`), the comm record and provenance; the last checkpoint's hint after an elastic failure."""
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
        summary = build_summary(plan, outcome, None, comm, made, ends=read_ends(answering, plan, rdzv_id, True))
        return dataclasses.replace(summary, trained_alone=[dataclasses.asdict(r) for r in alone_ranks(outcome)])
    result = read_result(answering, plan)
    # result.json is written at success only: a failed or stopped trainer run's restarts (torchrun's
    # restarts of failed workers among them, which no timeline shows), epochs and metrics are in its
    # hosts' starts.json and rank 0's progress.json and metrics.jsonl (the summary keeps those of the hosts
    # that held rank 0, `summary.rank0_hosts`, within the epochs the run was to train); and a run whose
    # agents stopped it because this controller was silent (a laptop closed) ended with status 143
    # everywhere: only each agent's exit.json tells that from a failure. One round reads them all.
    asks = "restarts" not in (result or {}) or outcome.status is JobStatus.FAILED
    ends = read_ends(answering, plan, rdzv_id, False, trainer=result is None) if asks else []
    return build_summary(plan, outcome, result, comm, made, ends=ends,
                         epochs=configured_epochs(record.workload.get("args")))


def alone_ranks(outcome: JobOutcome) -> list[AloneRank]:
    """The ranks of a --script run that trained alone, as the ends of this controller's copies of the
    hosts' logs say (deploy/run/alone.py): the runner's line is each such rank's last."""
    return trained_alone({h.host: tail(h.log, ALONE_READ) for h in outcome.hosts})


def launched(origin: Beside[dict], renderer: Renderer) -> dict | None:
    """The provenance read while the agents started, or None (said) when that reading failed: the run
    has ended, and its summary.json must be written whatever a host answered then."""
    try:
        return origin.result()
    except MeshrunError as err:
        renderer.warn(f"the run's provenance is not in its summary: {one_line(str(err))}")
        return None
