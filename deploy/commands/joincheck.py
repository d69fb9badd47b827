"""What `fab join` and `fab leave` refuse before any host is changed (deploy/commands/membership.py).

- A join into a run that has ended: its controller's summary.json says so, or (detached, no controller
  writes one) every member's agent reports the run over. The joiner's torchrun would wait for a
  rendezvous no one holds, and on a former member its new agent deletes that host's result.json and
  exit.json, the finished run's end (deploy/host/agent.py `forget_last_attempt`).
- A join whose joiner would run other code than the members: the join ships this checkout's tree, the
  members run the code their workdirs held at launch, and one DDP job of two versions crashes on a
  shape or diverges in silence. A running member is asked whether its workdir holds this checkout's
  code, as `fab train` asks a hinted host (deploy/run/codehint.py, deploy/edges/codehints.py).
- A leave of a host that did not answer: whether it still runs is not known, so "not running" would
  be a guess.
- A host a detached join would start a second agent on, and a leave below the elastic minimum.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from meshrun.deploy.commands.sync import code_files
from meshrun.deploy.edges.check_probes import open_sessions
from meshrun.deploy.edges.codehints import host_holds_content
from meshrun.deploy.edges.records import RunRecord, own_summary
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.edges.sync import is_project_itself
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.host import codestat
from meshrun.deploy.inventory.model import Inventory
from meshrun.deploy.project import Project
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.hoststate import STATES, HostState
from meshrun.deploy.run.plan import python_of

OVER = ("exited", "stopped", "lost")  # an agent's states of a run it no longer runs
# The agent's own "no": it answered, and holds no report of the run (never started there, or its tree is gone).
KNOWS_NOT = ("the agent does not know this run", "no report for this run")
WHY_CLIP = 200  # characters of why a host did not answer, in a leave's refusal


def answered(state: HostState) -> bool:
    """The host's agent said what it knows of the run; unreachable, stuck, or an answer not read is no answer."""
    return state.state in STATES or (state.state == "unknown" and state.detail in KNOWS_NOT)


def recorded_end(run_path: Path, run_id: str) -> str | None:
    """The status of the controller's own summary.json of the run (`own_summary`), or None."""
    found = own_summary(run_path, run_id)
    return found["status"] if found is not None else None


def members_end(members: Sequence[str], states: Sequence[HostState]) -> str | None:
    """How a detached run ended, as its members' agents report it ("h1 exited 0, h2 stopped 143"); None
    while one runs it, or may (no answer: whether it runs is not known), or when none ever ran it."""
    by_host = {s.host: s for s in states}
    mine = [by_host.get(m) for m in members]
    if not mine or any(s is None or not answered(s) or s.state == "running" for s in mine):
        return None
    over = [s for s in mine if s is not None and s.state in OVER]
    return ", ".join(f"{s.host} {s.state}" + (f" {s.rc}" if s.rc is not None else "") for s in over) or None


def ended_message(run_id: str, status: str, hosts: Sequence[str]) -> str:
    return (f"run {run_id} has ended ({status}); nothing started. Continue it with "
            f"fab train --resume {run_id} --hosts {','.join(hosts)}")


def resume_hosts(record: RunRecord, joiners: Sequence[str]) -> tuple[str, ...]:
    """The hosts a resume would take: the run's members, then the ones the user wanted to add."""
    return tuple(dict.fromkeys((*record.members, *joiners)))


def refuse_recorded_end(project: Project, record: RunRecord, joiners: Sequence[str]) -> None:
    """Before any host is asked: the controller wrote the run's end (a resume retires it: records.py)."""
    status = recorded_end(project.runs / record.run_id, record.run_id)
    if status is not None:
        raise InputError(ended_message(record.run_id, status, resume_hosts(record, joiners)))


def refuse_members_end(record: RunRecord, states: Sequence[HostState], joiner: str) -> None:
    """A detached join: no member's agent runs the run any more."""
    status = members_end(record.members, states)
    if status is not None:
        raise InputError(ended_message(record.run_id, status, resume_hosts(record, (joiner,))))


def refuse_running(record: RunRecord, name: str, states: Sequence[HostState]) -> None:
    """A detached agent has no heartbeat: a host cut off for a while runs on. Started a second time it
    would be two agents of one host in one rendezvous, on the same GPUs, each ending the other's
    workers until the run dies."""
    if any(st.host == name and st.state == "running" for st in states):
        raise MeshrunError(f"host '{name}' is still in run {record.run_id} (its agent is running); nothing started. "
                           f"To restart it there: fab leave --run {record.run_id} --hosts {name}, then fab join")


def said_busy(answer: object) -> bool:
    """The detached start's answer says another agent of the run already holds the host (exit 75)."""
    return isinstance(answer, dict) and answer.get("busy") is True


def below_minimum(record: RunRecord, name: str, running: int) -> None:
    """A leave that would take the run below its elastic minimum is refused: the others would wait
    for a host that never comes and fail at the join timeout, the run blamed on them."""
    if running - 1 < record.elastic[0]:
        raise MeshrunError(f"leaving {name} would leave {running - 1} host(s) in run {record.run_id}, below its "
                           f"elastic minimum of {record.elastic[0]}; end the whole run with fab stop --run "
                           f"{record.run_id}")


def leave_refusal(run_id: str, name: str, states: Sequence[HostState]) -> str | None:
    """Why a detached leave of `name` is refused, or None while its agent runs the run."""
    state = next((s for s in states if s.host == name), None)
    if state is not None and state.state == "running":
        return None
    if state is not None and not answered(state):
        why = said((state.detail or state.state).removeprefix(f"host '{name}': "), WHY_CLIP)
        return (f"host '{name}' did not answer ({why}); whether it still runs in run {run_id} is not known; "
                f"leave it again once it answers, or end the whole run with fab stop --run {run_id}")
    return f"host '{name}' is not running in run {run_id}"


def code_changed(record: RunRecord, member: str, joiner: str) -> str:
    return (f"run {record.run_id}: its member {member} does not hold this checkout's code (or did not answer the "
            "check): the checkout changed since the run was launched, and the joiner would run other code than the "
            f"members; restore the run's code (runs/{record.run_id}/provenance.json names its commit), or continue "
            f"the run on this code: fab stop --run {record.run_id}, then fab train --resume {record.run_id} "
            f"--hosts {','.join(resume_hosts(record, (joiner,)))}")


def require_run_code(record: RunRecord, inventory: Inventory, project: Project, sessions: Mapping[str, Session],
                     joiner: str) -> None:
    """Refuse the join unless the first member of `sessions` (in the record's order) holds the code the
    joiner is about to get; with none, there is no one to run another version beside.

    Hosts are untrusted, and the answer is compared, never used: a member that lies "holds" only lets
    the join go on (as every join did before this check), one that lies "differs" only refuses it."""
    # A member whose workdir is this project itself (`workdir: .`) runs this checkout as it is: no answer.
    asked = next((m for m in record.members if m != joiner and m in sessions
                  and not is_project_itself(inventory.host(m), project.root)), None)
    if asked is None:
        return
    files = code_files(inventory, project)  # the very list the joiner's sync sends
    # By content, not by times: a second clone or a file saved unchanged holds the same code.
    digest = codestat.content_digest(os.fsencode(project.root), [n for n in files.split(b"\0") if n])
    if not host_holds_content(sessions[asked], python_of(inventory.host(asked), sys.executable), files, digest):
        raise MeshrunError(code_changed(record, asked, joiner))


def require_run_code_reached(record: RunRecord, inventory: Inventory, project: Project, joiner: str) -> None:
    """A detached join's `require_run_code`: no controller holds sessions to the members, so they are
    connected to here, all at once, and the first reached in the record's order is asked (a member that
    left holds the launch's code as well); one that cannot be reached leaves the question to the next."""
    others = tuple(inventory.host(m) for m in record.members if m != joiner)
    if not others:
        return
    sessions, failed = open_sessions(others, inventory, project.root, DEFAULT_CONNECT_TIMEOUT_S)
    try:
        if not sessions:
            why = "; ".join(str(err) for err in failed.values())
            raise MeshrunError(f"run {record.run_id}: no member answered ({why}), so whether they run this "
                               "checkout's code is not known; nothing started, join again once one answers")
        require_run_code(record, inventory, project, sessions, joiner)
    finally:
        close_all(sessions)


def live_sessions(runner: object, joiner: str) -> dict[str, Session]:
    """An attached controller's sessions to the hosts that run the job (its JobRunner's newest entry
    per host, not done): the members are asked over them, no connect more. A stand-in runner without
    hosts has none."""
    return {live.name: live.session for live in list(getattr(runner, "hosts", ()))
            if live.name != joiner and not live.done.is_set()}
