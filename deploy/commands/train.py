"""`fab train`: connect, (check, sync,) plan, launch on every host at once, summarize."""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Mapping

from meshrun.layout import DEFAULT_PG_TIMEOUT_S, NOTIFY_CLOSE_S, log_path
from meshrun.deploy.run.resume import resumed_hosts
from meshrun.deploy.edges.checkpointpush import push_checkpoints
from meshrun.deploy.edges import comm as comm_cmd
from meshrun.deploy.commands.membership import RequestPoller
from meshrun.deploy.commands.check import preflight
from meshrun.deploy.commands.firewall import around_run
from meshrun.deploy.edges.sessions import SessionsLater, sessions_to, training_interfaces
from meshrun.deploy.commands.sync import SyncUnderRun, code_files, sync_code
from meshrun.deploy.edges import provenance
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.host.notify import Sender
from meshrun.deploy.run import notify
from meshrun.deploy.run.idle import IdlePolicy
from meshrun.deploy.edges.idle import IdleWatcher
from meshrun import events
from meshrun.deploy.errors import InputError, MeshrunError, interrupted_status
from meshrun.deploy.edges.detachedstart import StartInterrupted, start_detached, stop_started
from meshrun.deploy.inventory.load import load_inventory, inventory_path
from meshrun.deploy.project import Project, relative_to_project, script_arg_warnings
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.edges.agents import host_states, members_gone, recorded_inventory
from meshrun.deploy.edges.launcher import PING_TIMEOUT_S, JobRunner
from meshrun.deploy.commands.trainend import gathered
from meshrun.deploy.run.membership import MembershipEvent, split_brain_risk
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.plan import LaunchOptions, LaunchPlan, Workload, plan_launch, refuse_gpu_env
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.records import (RunRecord, load_record, new_run_id, refuse_running, retire_attempt,
                                          stored_inventory, write_summary)
from meshrun.deploy.edges.sync import is_project_itself
from meshrun.deploy.inventory.selection import Selection, parse_nnodes, select_hosts
from meshrun.deploy.run.workload import recorded_workload, refuse_trainer_flags, resumed_nnodes, resumed_work
from meshrun.deploy.run.alone import AloneRank, alone_warning
from meshrun.deploy.run.summary import RunSummary, build_summary
from meshrun.deploy.edges.trainercheck import check_trainer_args
from meshrun.deploy.edges.transport import Session, connect



@dataclass(frozen=True)
class TrainRequest:
    inventory: str | None
    hosts: str | None
    workload: Workload
    nnodes: str | None = None
    pg_timeout_s: int | None = None  # --timeout; None: the default, or a resumed run's own
    detach: bool = False
    skip_checks: bool = False
    no_sync: bool = False
    resume: str | None = None  # an earlier run id: same run directory, fresh rendezvous
    comm: str | None = None  # a comm hook, or "auto" (deploy/edges/comm.py)
    firewall: bool = False  # bracketed by `fab firewall` (deploy/commands/firewall.around_run)
    notify: tuple[str, ...] = ()  # webhook receivers (secrets: never printed, logged or recorded)
    idle: IdlePolicy = IdlePolicy()  # when a host counts as idle, and --idle-stop
    every_checkpoint: bool = False  # a `checkpoint` notification for each newer step a host lists
    timeout_given: bool = False  # --timeout typed: `--comm` then warns rather than raising it (deploy/edges/comm.py)


def _with_project_paths(request: TrainRequest, project: Project) -> TrainRequest:
    """--script and --config as the paths the hosts will find: inside the project, checked here,
    before any host is touched."""
    work = request.workload
    # A resume's paths are the record's, from the root (a resume naming another is refused before).
    cwd = project.root if request.resume else None
    script = relative_to_project(work.script, project, "--script", cwd=cwd) if work.script else None
    config = relative_to_project(work.config, project, "--config", packaged_ok=True, cwd=cwd) if work.config else None
    for line in script_arg_warnings(work.args if script else (), project, cwd):  # the ranks run in the root
        Renderer().warn(line)
    return dataclasses.replace(request, workload=dataclasses.replace(work, script=script, config=config))


def refuse_unshipped(request: TrainRequest, files: bytes, project: Project, hosts: tuple[Host, ...]) -> None:
    """A project's --script or --config that the code sync leaves out (gitignored, in a submodule)
    would reach no host, and every rank would fail "can't open file". A bare config name the
    project lacks is one of meshrun's own (train/configs/) and is not the project's to send. Hosts
    whose workdir is the project itself (the local default) get no copy and need none."""
    if request.no_sync or all(is_project_itself(h, project.root) for h in hosts):
        return
    shipped = frozenset(os.fsdecode(n) for n in files.split(b"\0") if n)
    for flag, path in (("--script", request.workload.script), ("--config", request.workload.config)):
        if path and (project.root / path).is_file() and path not in shipped:
            raise InputError(f"{flag} {path}: not among the files fab sync sends (gitignored or outside the "
                             "project); commit it or un-ignore it")


def _with_resumed_defaults(request: TrainRequest, project: Project, renderer: Renderer) -> TrainRequest:
    """`--resume ID` defaults to that run's inventory, the hosts of its latest attempt (not those an
    earlier `--resume --hosts` left out, which its record still lists), and what it ran, script or
    config, arguments and --timeout (deploy/run/workload.py). A run still running on the hosts this
    resume launches on is refused: a detached one's are asked, through the inventory this resume uses
    (a host left out cannot join the new attempt, whose rendezvous id is fresh, so its word is not
    needed: a compromised member left out could otherwise block every resume by saying `running`)."""
    given_timeout = request.pg_timeout_s
    if not request.resume:
        refuse_trainer_flags(request.workload, given_timeout is not None)
        return dataclasses.replace(request, pg_timeout_s=given_timeout or DEFAULT_PG_TIMEOUT_S,
                                   timeout_given=given_timeout is not None)
    record = load_record(project.runs, request.resume, "--resume")
    # The record's inventory is the project root's (a relative record's: a moved checkout's own); a typed one, as typed.
    path = (inventory_path(request.inventory, project.root) if request.inventory
            else recorded_inventory(record, project.root))
    loaded = load_inventory(path, project.root)
    if request.hosts is None and (gone := members_gone(record, loaded.host_names, path)):
        raise InputError(gone)
    hosts = request.hosts or ",".join(record.members)
    names = tuple(h.name for h in select_hosts(loaded, hosts).hosts)
    asked = dataclasses.replace(record, inventory=str(path.absolute()), hosts=names, earlier=())
    refuse_running(project.runs, record, lambda: host_states(asked, project.root))
    # The flags as typed are the project's paths from here (`./train.py` is the record's `train.py`).
    given = _with_project_paths(dataclasses.replace(request, resume=None), project).workload
    work = resumed_work(record.run_id, recorded_workload(record.workload), record.pg_timeout_s, given,
                        given_timeout, request.comm is not None)
    refuse_trainer_flags(work.workload, given_timeout is not None)
    nnodes = request.nnodes or resumed_nnodes(record.elastic, len(names))
    for line in (work.note, f"resume: elastic as the run was: --nnodes {nnodes}" if nnodes != request.nnodes else None):
        if line:
            renderer.info(line)
    return dataclasses.replace(request, inventory=request.inventory or str(path), hosts=hosts, workload=work.workload,
                               pg_timeout_s=work.pg_timeout_s, nnodes=nnodes, timeout_given=given_timeout is not None)


def train(request: TrainRequest, renderer: Renderer, project: Project) -> int:
    """Pre-flight, sync, plan, launch on every host at once, then summarize. Exit status 0/1."""
    request = _with_project_paths(_with_resumed_defaults(request, project, renderer), project)
    check_trainer_args(request.workload, request.pg_timeout_s, project.root)  # before any host is contacted
    gradients = _comm_checked(request, project)  # --comm, and the model it plans for: before any host too
    inventory = load_inventory(inventory_path(request.inventory, project.root), project.root)
    selection = _selection(request, inventory, renderer)
    hosts = selection.hosts
    refuse_gpu_env(hosts)  # before any host is contacted
    urls = notify.receivers(request.notify, inventory.notify)  # checked before any host is contacted
    if request.every_checkpoint and not urls:
        raise InputError("--every-checkpoint adds notifications, and this run sends none: add --notify URL, or "
                         "`notify:` to the inventory")
    options = _launch_options(request, inventory, len(hosts), renderer)
    run_id = options.run_id
    files = code_files(inventory, project)
    refuse_unshipped(request, files, project, hosts)  # before any host is contacted
    # The code sync needs no session (rsync brings its own ssh): it runs while they open and the
    # pre-flight checks, and is waited for before anything uses the code (_prepare_hosts). A host
    # it last synced this very code is asked first, over its session once open (deploy/run/codehint.py).
    later = SessionsLater()
    syncing = None if request.no_sync else Beside(sync_code, hosts, inventory, project, renderer, files, later)
    try:
        with sessions_to(hosts, inventory, project.root) as sessions:
            later.put(sessions)
            interfaces = _checked_routes(request.skip_checks, selection, sessions, renderer,  # as the code syncs
                                         options.elastic is not None, project)
            options = _prepare_hosts(request, selection, inventory, sessions, options, project, renderer, syncing,
                                     gradients)
            plan = plan_launch(selection, options, interfaces, sys.executable)
            record = _record(request, inventory, hosts, plan, options, project, renderer)
            renderer.run_started(run_id, [h.name for h in hosts], plan.world_size, str(project.run_home(run_id)))
            # What the hosts run is read while their agents start: only the records need it.
            origin = Beside(provenance.at_launch, hosts, sessions, project.root, files, sys.executable)
            if request.detach:
                return _detached(plan, sessions, urls, request.every_checkpoint, origin, project, renderer)
            sender = Sender(urls, renderer.warn)
            sender.send(notify.started(run_id, time.time(), [h.name for h in hosts], plan.world_size))
            outcome, summary = _run_attached(plan, record, inventory, sessions, project, renderer, origin, sender,
                                             request.idle, request.every_checkpoint)
    except MeshrunError:
        later.put({})  # a failed connect: the hinted hosts are synced without asking (a later put is ignored)
        if syncing is not None:
            syncing.settle()  # a failed connect or pre-flight leaves the hosts' code whole, not half-synced
        raise
    status = _conclude(outcome, summary, project, renderer)
    sender.send(notify.ended(run_id, outcome.ended, summary.status, summary.duration_s, summary.reason,
                             summary.failed_host))
    sender.close(NOTIFY_CLOSE_S)
    return status


def _selection(request: TrainRequest, inventory: Inventory, renderer: Renderer) -> Selection:
    """The hosts to train on; a resume's without the inventory's rendezvous host moves it (selection.py)."""
    selection = select_hosts(inventory, request.hosts)
    if not request.resume:
        return selection
    selection, moved = selection.resumable()
    if moved:
        renderer.warn(moved)
    return selection


def _comm_checked(request: TrainRequest, project: Project) -> comm_cmd.Gradients | None:
    """`--comm`'s value, and the model described with a hook the trainer would refuse (flat DiLoCo
    with sync_bn) refused in one line, before any host is contacted (None without --comm)."""
    if not request.comm:
        return None
    comm_cmd.parse_comm(request.comm, request.workload)
    return comm_cmd.check_comm(request.comm, request.workload, project.root)


def _checked_routes(skip_checks: bool, selection: Selection, sessions: Mapping[str, Session],
                    renderer: Renderer, elastic: bool = False, project: Project | None = None) -> dict[str, str]:
    """The pre-flight and, beside it, each host's route to the rendezvous host (the interfaces the
    launch names): neither needs the other's answer, and over a far link each is a round of
    commands (~0.5 s) before the agents can start. A failed pre-flight waits for the routes' end."""
    routes = Beside(training_interfaces, selection.hosts, selection.head, sessions)
    try:
        if not skip_checks:
            # elastic: every successor's port too; the project: its requirements against each host's setup
            preflight(selection, sessions, renderer, elastic=elastic, root=project.root if project else None)
    except BaseException:
        routes.settle()
        raise
    return routes.result()


def _launch_options(request: TrainRequest, inventory: Inventory, count: int, renderer: Renderer) -> LaunchOptions:
    """The run's id and how it launches, from the request (a resume gets a fresh rendezvous id)."""
    elastic = parse_nnodes(request.nnodes, inventory, count)
    if elastic is not None and (risk := split_brain_risk(elastic, count)):
        renderer.warn(risk)
    run_id = request.resume or new_run_id()
    rdzv_id = f"{run_id}-{secrets.token_hex(2)}" if request.resume else None
    return LaunchOptions(run_id, request.workload, request.pg_timeout_s, elastic, detach=request.detach,
                         rdzv_id=rdzv_id, idle=request.idle if request.detach else None,
                         usage_every_s=None if request.detach else request.idle.sample_s)


def _detached(plan: LaunchPlan, sessions: Mapping[str, Session], urls: tuple[str, ...], every_checkpoint: bool,
              origin: Beside[dict], project: Project, renderer: Renderer) -> int:
    try:
        start_detached(plan, sessions, urls, every_checkpoint)
    except StartInterrupted as interrupted:
        stop_started(plan.run_id, interrupted.started, project, renderer, interrupted.unsure)
        raise
    provenance.save_at_launch(project.runs, plan.run_id, origin.result())
    renderer.info(f"run {plan.run_id} is running detached; follow it: fab logs --run {plan.run_id} -f; "
                  f"state: fab status --run {plan.run_id}; stop it: fab stop --run {plan.run_id}")
    return 0


def _prepare_hosts(request: TrainRequest, selection: Selection, inventory: Inventory,
                   sessions: Mapping[str, Session], options: LaunchOptions, project: Project,
                   renderer: Renderer, syncing: Beside | None,
                   gradients: comm_cmd.Gradients | None = None) -> LaunchOptions:
    """After the pre-flight: the code sync's end, checkpoints back for a resume, the comm hook choice."""
    if syncing is not None:
        try:
            synced = syncing.result()  # its error, naming each host that failed
        except SyncUnderRun as err:
            raise MeshrunError(f"{err}; or start this run beside it on the code those hosts hold: --no-sync") from None
        if unchanged := [r.host for r in synced.values() if r.unchanged]:
            renderer.info(f"sync: the code on {len(unchanged)} of {len(synced)} host(s) was already this project's "
                          "(every file's size and mtime, as rsync compares them); nothing sent there")
    if request.resume:
        push_checkpoints(selection, sessions, options.run_id, inventory, project, renderer)
    workload, comm_plan = options.workload, None
    if request.comm:
        workload, comm_plan = comm_cmd.choose(request.comm, selection, sessions, workload, project.root, renderer,
                                              gradients, timeout_s=options.pg_timeout_s,
                                              timeout_given=request.timeout_given)
    if request.resume and (retired := retire_attempt(project.run_home(options.run_id))):
        # This attempt begins, its pre-launch steps through (a failed one leaves the last attempt's
        # summary in place): that summary (and provenance, --comm floors) would make the run look
        # ended, and read as this one's (deploy/edges/records.retire_attempt).
        renderer.info(f"resume: the previous attempt's {', '.join(retired)} kept as *.prev.json")
    if comm_plan is not None:
        comm_cmd.save_plan(project.runs, options.run_id, comm_plan, comm_cmd.applied_hook(workload))
    return dataclasses.replace(options, workload=workload)


def _record(request: TrainRequest, inventory: Inventory, hosts: tuple[Host, ...], plan: LaunchPlan,
            options: LaunchOptions, project: Project, renderer: Renderer) -> RunRecord:
    """launch.json; a resumed run's still lists the hosts of its earlier attempts (resumed_hosts)."""
    elastic, names, earlier = options.elastic, tuple(h.name for h in hosts), ()
    if request.resume:
        before = load_record(project.runs, options.run_id, "--resume").hosts
        resumed = resumed_hosts(before, names, inventory.host_names)
        names, earlier = resumed.hosts, resumed.earlier
        if resumed.dropped:
            gone = f"resume: {', '.join(resumed.dropped)}, of an earlier attempt, not in "
            renderer.warn(with_path(gone, inventory.path, ": the run's record no longer lists them (their files stay)"))
    record = RunRecord(options.run_id, stored_inventory(inventory.path, project.root), names, time.time(),
                       request.detach, plan.rdzv_endpoint, options.rendezvous_id,
                       (elastic.min, elastic.max) if elastic else None, dataclasses.asdict(options.workload),
                       request.pg_timeout_s, None if request.detach else os.getpid(), request.firewall, earlier)
    record.save(project.runs)
    return record


def _run_attached(plan: LaunchPlan, record: RunRecord, inventory: Inventory, sessions: Mapping[str, Session],
                  project: Project, renderer: Renderer, origin: Beside[dict], sender: Sender,
                  policy: IdlePolicy, every_checkpoint: bool = False) -> tuple[JobOutcome, RunSummary]:
    """Run with this controller watching; returns the outcome and the summary to write."""
    poller = RequestPoller(record, inventory, project, renderer) if plan.elastic else None
    outcome, idle = _watched(plan, inventory, sessions, project, renderer, poller, sender, policy, every_checkpoint)
    try:
        return outcome, dataclasses.replace(gathered(plan, outcome, record, sessions, project, renderer, origin),
                                            idle=idle)
    except KeyboardInterrupt:
        # The job has ended, and only the hosts' answers were being read (seconds over a far link): a
        # Ctrl-C now must not lose what this controller saw, so summary.json is written from that alone.
        bare = dataclasses.replace(build_summary(plan, outcome, None), idle=idle)
        path = write_summary(project.run_home(outcome.run_id), bare)
        renderer.warn(f"interrupted while reading the hosts' results: {path} holds what this controller saw "
                      "(no trainer metrics); the hosts' files stay there: fab fetch-checkpoints --run "
                      f"{outcome.run_id}")
        raise


def _watched(plan: LaunchPlan, inventory: Inventory, sessions: Mapping[str, Session], project: Project,
             renderer: Renderer, poller: RequestPoller | None, sender: Sender,
             policy: IdlePolicy, every_checkpoint: bool) -> tuple[JobOutcome, list[dict]]:
    """The JobRunner, its membership changes shown and sent, its hosts watched for idleness."""
    reconnect = (lambda host: connect(host, inventory.known_hosts, project.root, PING_TIMEOUT_S))

    def membership(event: MembershipEvent) -> None:
        renderer.membership(event)
        if (body := notify.membership(plan.run_id, event)) is not None:
            sender.send(body)

    def tell(host: str, now: float, idle_s: float, stopping: bool) -> None:
        sender.send(events.idle(plan.run_id, now, host, idle_s, policy.threshold, stopping))

    def checkpoint(host: str, now: float, step: int) -> None:
        sender.send(events.checkpoint(plan.run_id, now, step, host))

    watcher = IdleWatcher(policy, tuple(h.host for h in plan.hosts), renderer.warn, tell,
                          checkpoint if every_checkpoint else None)

    def requests(runner: JobRunner) -> None:
        if poller is not None:
            poller(runner)
        watcher.check(runner)

    try:
        outcome = JobRunner(plan, sessions, renderer.log_line, project.run_home(plan.run_id), sys.executable,
                            requests, membership, reconnect, watcher.feed).run()  # type: ignore[arg-type]
    finally:
        watcher.close()
    if watcher.stop_reason is not None:  # stopped as a Ctrl-C would, by no signal: a stopped run's status, 1
        outcome = dataclasses.replace(outcome, reason=watcher.stop_reason, interrupted=None)
    return outcome, watcher.warnings


def _conclude(outcome: JobOutcome, summary: RunSummary, project: Project, renderer: Renderer) -> int:
    path = write_summary(project.run_home(outcome.run_id), summary)
    # The summary's word: a run the agents stopped for this controller's silence is no host's failure.
    if summary.status == JobStatus.FAILED.value and outcome.failed_host:
        renderer.failure_tail(outcome, log_path(outcome.run_id, outcome.failed_host))
    if summary.comm and summary.comm["measured_s"] is not None:
        c = summary.comm
        renderer.info(f"comm: {c['hook']} all-reduce {c['measured_s'] * 1e3:.1f} ms per step, ring floor "
                      f"{c['floor_s'] * 1e3:.1f} ms at {c['bandwidth_mbit_s']} Mbit/s ({c['ratio']}x)")
    renderer.job_summary(summary, outcome, str(path))
    if alone := alone_warning(AloneRank(**r) for r in summary.trained_alone):
        renderer.warn(alone)
    if outcome.interrupted:  # as every other task a signal ends: 130 for a Ctrl-C (deploy/errors.py)
        return interrupted_status(outcome.interrupted)
    return 0 if outcome.status is JobStatus.SUCCEEDED else 1


def main(request: TrainRequest, project: Project) -> int:
    """`fab train`; returns the exit status. With --firewall, bracketed by the firewall on the hosts
    it launches on: a bare resume's are its record's (the bracket went up on the default
    inventory's every host), and may leave out the rendezvous host that died."""
    if not request.firewall:
        return train(request, Renderer(), project)
    inventory, hosts = request.inventory, request.hosts
    if request.resume:
        record = load_record(project.runs, request.resume, "--resume")
        inventory = inventory or str(recorded_inventory(record, project.root))  # a relative record's: from the root
        hosts = hosts or ",".join(record.members)
    return around_run(inventory, hosts, request.detach, lambda: train(request, Renderer(), project), project,
                      resume=bool(request.resume))
