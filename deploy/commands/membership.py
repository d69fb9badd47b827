"""`fab join` and `fab leave` for elastic runs.

An attached run is watched by its `fab train` controller, which must own every host's stream,
heartbeats and timeline. So `join`/`leave` drop a request file in `runs/<id>/requests/`, the
controller (RequestPoller) carries it out and answers with `<request>.done.json`. A detached
run has no controller: `join`/`leave` act on the hosts directly.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from meshrun.fsutil import atomic_write_json, read_regular
from meshrun.layout import RECORD_LOCK
from meshrun.deploy.edges.host_queries import route_dev
from meshrun.deploy.cli import internal_error
from meshrun.deploy.project import Project
from meshrun.deploy.commands.firewall import admit, release
from meshrun.deploy.commands.joincheck import (below_minimum, leave_refusal, live_sessions, refuse_members_end,
                                               refuse_recorded_end, refuse_running, require_run_code,
                                               require_run_code_reached, said_busy)
from meshrun.deploy.commands.sync import sync_code
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.edges.agents import detached_answer, given_inventory, load_run_inventory, run_detached_agent
from meshrun.deploy.edges.launcher import JobRunner
from meshrun.deploy.inventory.model import ElasticBounds, Host, Inventory, Rendezvous
from meshrun.deploy.run.answers import detached_record, from_json
from meshrun.deploy.run.workload import recorded_workload
from meshrun.deploy.run.plan import HostLaunch, LaunchOptions, at_generation, plan_launch
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.records import RunRecord, controller_alive, load_record
from meshrun.deploy.inventory.selection import Selection, select_hosts
from meshrun.deploy.inventory.shown import shown, with_path
from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.transport import Session, connect

ANSWER_TIMEOUT_S = 180.0
REQUEST_MAX = 64 << 10  # a request or an answer: one host name and a message


@dataclass(frozen=True)
class Request:
    action: str  # "join" | "leave"
    host: str
    path: Path


def requests_dir(project: Project, run_id: str) -> Path:
    return project.run_home(run_id) / "requests"


def options_of(record: RunRecord) -> LaunchOptions:
    if record.elastic is None:
        raise InputError(f"run {record.run_id} is not elastic, so hosts cannot join or leave it; "
                         "start it with --nnodes MIN:MAX (or `elastic:` in the inventory)")
    return LaunchOptions(record.run_id, recorded_workload(record.workload), record.pg_timeout_s, ElasticBounds(*record.elastic),
                         detach=False, rdzv_id=record.rdzv_id)


def prepare_joiner(record: RunRecord, inventory: Inventory, name: str, project: Project, renderer: Renderer,
                   detach: bool) -> tuple[HostLaunch, Session]:
    """Connect to, sync and plan one joining host with the run's own rendezvous, once a member holds the
    code it is about to get (joincheck.py). Failed or cut short once `admit` raised the joiner's chain,
    it takes that chain down again (`let_go`)."""
    options = options_of(record)
    if detach:
        options = dataclasses.replace(options, detach=True)
    if gone := [h for h in record.members if h not in inventory.host_names]:  # an --inventory naming only some
        raise InputError(with_path(f"run {record.run_id}'s member(s) {', '.join(gone)} are not in ", inventory.path,
                                   "; join through an inventory that names every member"))
    members = tuple(inventory.host(h) for h in record.members)  # not an earlier attempt's hosts: not in the job
    joiner = select_hosts(inventory, name).hosts[0]
    address, _, port = record.rdzv_endpoint.rpartition(":")
    head = next((h for h in members if address == h.address), None)
    if head is None or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InputError(f"run {record.run_id}: its rendezvous {shown(record.rdzv_endpoint)} is no member's address "
                         f"and port in {record.inventory}; was the inventory changed?")
    sshtarget.check_all((joiner,))  # a bad ssh_config value is one line before any host is contacted
    if detach:  # an attached run's controller asked over its own sessions first (RequestPoller._join)
        require_run_code_reached(record, inventory, project, name)
    try:  # `admit` inside: its `up` may reach the joiner before another member fails, or a Ctrl-C
        if record.firewall:  # the joiner last: it must answer
            admit(inventory, (*(h for h in record.members if h != name), name), head.name, project, renderer)
        rdzv = Rendezvous(head.name, int(port))
        return _connected(record, inventory, project, renderer, options, members, joiner, rdzv)
    except BaseException:
        let_go(record, inventory, name, project, renderer)
        raise


def _connected(record: RunRecord, inventory: Inventory, project: Project, renderer: Renderer, options: LaunchOptions,
               members: tuple[Host, ...], joiner: Host, rdzv: Rendezvous) -> tuple[HostLaunch, Session]:
    """The joiner connected, synced and planned; its session closed should any of it fail."""
    session = connect(joiner, inventory.known_hosts, project.root)
    try:
        sync_code((joiner,), inventory, project, renderer)
        # Only the joiner's own route is asked (toward the first rendezvous host's address, or another
        # member's when it is that host): no session to that host, which may be gone after a succession.
        head = inventory.host(rdzv.host)
        peer = head if head.name != joiner.name else next((m for m in members if m.name != joiner.name), None)
        device = route_dev(session, peer.address) if peer is not None and not joiner.is_local else ""
        interfaces = {joiner.name: device} if device else {}
        plan = plan_launch(Selection(join_order(members, joiner), rdzv), options, interfaces, sys.executable)
        return next(h for h in plan.hosts if h.host.name == joiner.name), session
    except BaseException:
        session.close()
        raise


def let_go(record: RunRecord, inventory: Inventory, name: str, project: Project, renderer: Renderer) -> None:
    """A join of a --firewall run that failed, or was cut short, after `admit`: the joiner's chain
    down again (firewall.release). Never raises: the join's own error is the one to show."""
    if not record.firewall:
        return
    try:
        release(inventory, name, project, renderer)
    except MeshrunError as err:
        renderer.warn(f"host '{name}': its firewall chain may still be up ({err}); take it down with "
                      f"fab firewall down --hosts {name}")


def join_order(members: tuple[Host, ...], joiner: Host) -> tuple[Host, ...]:
    """The succession order a joiner walks: the members', so that every agent looks for the next
    store at the same address. A former member keeps its old place (moved to the end, it and the
    others would each look for the next store at the other's address once the first rendezvous host
    died, and neither would hold one); a new host comes after them."""
    if any(m.name == joiner.name for m in members):
        return tuple(joiner if m.name == joiner.name else m for m in members)
    return (*members, joiner)


def add_member(project: Project, record: RunRecord, name: str) -> RunRecord:
    """The run record lists every host that ever took part, so status/stop/fetch reach it. The record on
    disk is re-read and merged under a lock beside it: two `fab join`s, or two join threads of one
    controller, each saving the list it read earlier would drop the other's host, and `fab stop` would
    then never reach that host's agent."""
    # A host of an earlier attempt (`fab train --resume` left it out) that joins is a member again.
    return _changed(project, record, lambda current: dataclasses.replace(
        current, hosts=merged_hosts(current.hosts, record.hosts, name)).with_member(name))


def drop_member(project: Project, record: RunRecord, name: str) -> RunRecord:
    """A detached join whose agent did not start: still listed, no longer a member, so the next bare
    `fab train --resume` does not launch on a host that never ran the run (same lock as add_member)."""
    return _changed(project, record, lambda current: current.without_member(name))


def _changed(project: Project, record: RunRecord, change: Callable[[RunRecord], RunRecord]) -> RunRecord:
    home = project.runs / record.run_id
    home.mkdir(parents=True, exist_ok=True)
    with open(home / RECORD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        current = load_record(project.runs, record.run_id)
        updated = change(current)
        if updated == current:
            return current
        updated.save(project.runs)
    return updated


def merged_hosts(on_disk: tuple[str, ...], known: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The record's hosts on disk, then any this caller knew that it lacks, then `name`: hosts are only
    ever added, so the union loses no one, in the order they took part."""
    hosts = list(on_disk)
    for host in (*known, name):
        if host not in hosts:
            hosts.append(host)
    return tuple(hosts)


def submit(project: Project, record: RunRecord, action: str, host: str) -> dict:
    """Hand a request to the attached controller and wait for its answer."""
    directory = requests_dir(project, record.run_id)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{time.time():.3f}-{secrets.token_hex(2)}-{action}-{host}.json"
    tmp = path.with_name("." + path.name)
    tmp.write_text(json.dumps({"action": action, "host": host}))
    os.replace(tmp, path)
    answer = path.with_name(path.stem + ".done.json")
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        if answer.exists():
            return _answer(answer)
        time.sleep(0.2)
    raise MeshrunError(f"run {record.run_id}: its controller did not answer the {action} of '{host}' within "
                       f"{ANSWER_TIMEOUT_S:.0f} s; is the controller that started it still running? (fab status --run {record.run_id})")


def _request_data(path: Path) -> dict | None:
    """{"action": "join"|"leave", "host": name} from a request file, or None: the controller reads these files
    while it runs a job, so a FIFO, a huge file or a wrong shape must neither block nor crash it."""
    try:
        data = from_json(read_regular(path, REQUEST_MAX).decode("utf-8", "replace"))
    except OSError:
        return None
    ok = isinstance(data, dict) and data.get("action") in ("join", "leave") and isinstance(data.get("host"), str)
    return data if ok else None


def _answer(path: Path) -> dict:
    try:
        data = from_json(read_regular(path, REQUEST_MAX).decode("utf-8", "replace"))
    except OSError as err:
        data = {"ok": False, "message": f"unreadable answer {path} ({err})"}
    if not (isinstance(data, dict) and isinstance(data.get("ok"), bool) and isinstance(data.get("message"), str)):
        return {"ok": False, "message": f"the controller's answer {path.name} is not one it writes"}
    return data


class RequestPoller:
    """Called by the attached controller's JobRunner loop: carries out join/leave requests."""

    def __init__(self, record: RunRecord, inventory: Inventory, project: Project, renderer: Renderer) -> None:
        self.record = record
        self.inventory = inventory
        self.project = project
        self.renderer = renderer
        self.record_lock = threading.Lock()  # join threads: the last to set self.record holds every host
        # A resumed run reuses its run directory: the requests of an earlier controller, answered or
        # left unanswered when it died, are history, never carried out again.
        directory = requests_dir(project, record.run_id)
        self.seen: set[Path] = set(directory.glob("[0-9]*.json")) if directory.is_dir() else set()

    def __call__(self, runner: JobRunner) -> None:
        directory = requests_dir(self.project, self.record.run_id)
        if not directory.is_dir():
            return
        for path in sorted(directory.glob("[0-9]*.json")):
            if path.name.endswith(".done.json") or path in self.seen:
                continue
            self.seen.add(path)
            data = _request_data(path)
            if data is None:  # not a request `fab join|leave` wrote: never a reason to stop the run
                self.renderer.warn(f"ignored {path.name} in {path.parent}: not a join or leave request")
                continue
            request = Request(data["action"], data["host"], path)
            threading.Thread(target=self._handle, args=(runner, request), daemon=True).start()

    def _handle(self, runner: JobRunner, request: Request) -> None:
        try:
            message = self._join(runner, request.host) if request.action == "join" else self._leave(runner, request.host)
            answer = {"ok": True, "message": message}
        except MeshrunError as err:
            answer = {"ok": False, "message": str(err)}
        except Exception as err:  # noqa: BLE001 - an OSError (record unsaved) or a bug: answer now, not in 180 s
            why = err if isinstance(err, OSError) else internal_error(err)
            answer = {"ok": False, "message": f"host '{request.host}': {request.action} failed: {why}"}
        self.renderer.info(f"{request.action} {request.host}: {answer['message']}")
        atomic_write_json(request.path.with_name(request.path.stem + ".done.json"), answer)

    def _join(self, runner: JobRunner, name: str) -> str:
        if run_ending(runner):  # before anything is raised on the joiner: nothing would take it down
            raise MeshrunError(f"host '{name}': run {self.record.run_id} is ending; nothing started")
        refused = runner.claim(name)
        if refused is not None:
            raise MeshrunError(refused)
        try:  # a member's code first, before the joiner's chain or files change
            require_run_code(self.record, self.inventory, self.project, live_sessions(runner, name), name)
            launch, session = prepare_joiner(self.record, self.inventory, name, self.project, self.renderer,
                                             detach=False)
            self._start(runner, name, launch, session)
        finally:
            runner.unclaim(name)
        with self.record_lock:
            self.record = add_member(self.project, self.record, name)
        return f"started on {name}; the job re-rendezvouses to take it in"

    def _start(self, runner: JobRunner, name: str, launch: HostLaunch, session: Session) -> None:
        """The prepared joiner's agent, unless the controller began stopping every host meanwhile (an
        agent started then would outlive "every host is clean"); a start that fails lets it go."""
        try:
            if run_ending(runner):
                raise MeshrunError(f"host '{name}': run {self.record.run_id} is ending; nothing started")
            runner.add_host(launch, session)
        except BaseException:
            session.close()
            let_go(self.record, self.inventory, name, self.project, self.renderer)
            raise

    def _leave(self, runner: JobRunner, name: str) -> str:
        running = [h.name for h in runner.hosts if not h.done.is_set()]
        if name not in running:
            raise MeshrunError(f"host '{name}' is not running in run {self.record.run_id}")
        below_minimum(self.record, name, len(set(running)))
        runner.remove_host(name)
        return f"stopping {name}; the others go on while at least {self.record.elastic[0]} host(s) remain"


def run_ending(runner: JobRunner) -> bool:
    """The controller is stopping every host (a failure, Ctrl-C) or the job is over: JobRunner's
    `stopping`. A stand-in runner without one never ends."""
    stopping = getattr(runner, "stopping", None)
    return stopping is not None and stopping.is_set()


def join_or_leave(project: Project, record: RunRecord, action: str, hosts: list[str], renderer: Renderer) -> list[str]:
    """Carry out `fab join|leave` for each host; returns one message per host."""
    options_of(record)  # refuses non-elastic runs up front
    if action == "join":  # an ended run's before any host is asked; a resume retires its summary.json
        refuse_recorded_end(project, record, hosts)
    inventory = load_run_inventory(record, project.root)  # --inventory, else the record's, from this root
    for name in hosts:
        select_hosts(inventory, name)  # unknown hosts get the usual one-line error
        if name not in inventory.host_names:  # a group, or `host:0,1`: the record and the order take names
            raise InputError(f"--hosts {shown(name)}: join and leave take host names, one by one "
                             f"(hosts: {', '.join(inventory.host_names)})")
    if controller_alive(record):
        if given_inventory() is not None:  # the attached controller plans with the inventory it launched with
            raise InputError(f"run {record.run_id} is attached to a fab train that plans with the inventory it was "
                             f"started with: --inventory cannot change it; leave it out, or stop the run and resume it "
                             f"on the new inventory (fab train --resume {record.run_id} --inventory NEW)")
        answers = [submit(project, record, action, name) for name in hosts]
        failed = [a["message"] for a in answers if not a["ok"]]
        if failed:
            raise MeshrunError("; ".join(failed))
        return [a["message"] for a in answers]
    messages = []
    for name in hosts:  # each host's record goes to the next: saving the first one read would drop the others
        message, record = _detached(project, record, inventory, action, name, renderer)
        messages.append(message)
    return messages


def _detached(project: Project, record: RunRecord, inventory: Inventory, action: str, name: str,
              renderer: Renderer) -> tuple[str, RunRecord]:
    """One host's detached join or leave: its message, and the run record as it now stands."""
    from meshrun.deploy.edges.agents import host_states, stop_hosts

    if action == "leave":
        states = host_states(record, project.root)
        refused = leave_refusal(record.run_id, name, states)
        if refused is not None:  # a host that did not answer may run on: "not running" would be a guess
            raise MeshrunError(refused)
        below_minimum(record, name, len({st.host for st in states if st.state == "running"}))
        failed = stop_hosts(record, project.root, (name,)).failed
        if failed:
            raise MeshrunError(str(failed[name]))
        return f"stopped run {record.run_id} on {name}", record
    # The joiner is asked too, even when the record lacks it (a join an older meshrun lost from the record).
    asked = record if name in record.hosts else dataclasses.replace(record, hosts=(*record.hosts, name))
    states = host_states(asked, project.root)
    refuse_running(record, name, states)
    refuse_members_end(record, states, name)  # no agent of it left: no rendezvous to join, a member's end kept
    # Detached, no controller knows where the rendezvous went: the members' agents do.
    generation = max((st.generation or 0 for st in states if st.state == "running"), default=0)
    launch, session = prepare_joiner(record, inventory, name, project, renderer, detach=True)
    try:
        launch = at_generation(launch, generation)
        # Listed before its agent starts: a Ctrl-C while the start waits for the agent's pidfile left
        # it training, detached, where no `fab stop|status|leave` looked. Listed and never started, a
        # host is one `stop` finds nothing on and `status` shows as not knowing the run; hosts are
        # only ever added to the record (a concurrent join of it may be the one that runs there).
        record = add_member(project, record, name)
        result = run_detached_agent(session, launch)
    except BaseException:
        let_go(record, inventory, name, project, renderer)
        raise
    finally:
        session.close()
    if result.rc != 0:
        answer = detached_answer(result)
        if not said_busy(answer):  # busy: another agent of the run holds the host, behind the run's chain
            let_go(record, inventory, name, project, renderer)
            drop_member(project, record, name)
        detached_record(name, answer)  # the agent's own words (its JSON on stdout), as one line
        raise MeshrunError(f"host '{name}': detached start failed: exit status {result.rc}")
    return f"started detached on {name}", record


def main(action: str, run: str, hosts: str, project: Project) -> None:
    """`fab join|leave --run ID --hosts NAMES`."""
    if not run or not hosts:
        raise InputError(f"fab {action} needs --run ID and --hosts NAME[,NAME...]")
    renderer = Renderer()
    for message in join_or_leave(project, load_record(project.runs, run), action, hosts.split(","), renderer):
        renderer.info(message)
