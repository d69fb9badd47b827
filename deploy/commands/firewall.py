"""`fab firewall up|down|status` (and `fab train --firewall`): meshrun's own chain in each host's
iptables, allowing SSH and the member hosts on the training interface, refusing all other TCP.

The rules are planned here from the inventory (deploy/run/firewall.py) and run on each host by
deploy/host/firewall.py, shipped as `python -c` so it works before `fab sync`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from meshrun.deploy.edges.check_probes import open_sessions, probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.sessions import close_all, sessions_to, training_interfaces
from meshrun.deploy.edges.sshtarget import resolve
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, Session, last_json_line
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.edges.records import all_records
from meshrun.deploy.inventory.model import Host, Inventory, Rendezvous
from meshrun.deploy.inventory.selection import Selection, select_hosts
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.firewall import (Action, FirewallSpec, HostAnswer, host_answer, host_request,
                                          member_addresses, parse_action, ssh_ports)
from meshrun.deploy.run.plan import python_of

HOST_LIMIT_S = 120  # a few dozen iptables calls, each bounded on the host


@dataclass(frozen=True)
class FirewallRequest:
    action: str
    inventory: str | None
    hosts: str | None
    resume: bool = False  # a `fab train --resume`'s bracket: its hosts may leave out rendezvous.host (it died)


def specs_for(selection: Selection, interfaces: Mapping[str, str],
              ssh_connections: Mapping[str, str]) -> dict[str, FirewallSpec]:
    """Every selected host allows the same members: the selection's training addresses."""
    members = member_addresses(tuple(h.address for h in selection.hosts))
    # A host alone has no peer to route to: its members are itself, reached on lo (already allowed).
    return {h.name: FirewallSpec(ssh_ports(resolve(h).target.port, ssh_connections.get(h.name, "")),
                                 interfaces.get(h.name, "lo"), members)
            for h in selection.hosts}


def _on_host(session: Session, host: Host, request: str) -> HostAnswer:
    result = session.run(probe_argv(python_of(host, sys.executable), "firewall", request), timeout=HOST_LIMIT_S)
    try:
        answer = last_json_line(result.stdout)
    except (ValueError, IndexError):
        why = (result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1]
        raise MeshrunError(f"host '{host.name}': the firewall script failed: {said(why)}") from None
    return host_answer(host.name, answer)


def apply(action: Action, selection: Selection, sessions: Mapping[str, Session]) -> dict[str, HostAnswer]:
    """Run `action` on every selected host that has a session (all of them, for `fab firewall`; the
    members are the whole selection either way); raises one line naming every host that failed."""
    if any(h.is_local for h in selection.hosts):
        raise InputError("fab firewall: a local host is this machine; meshrun does not change its firewall")
    remote = tuple(h for h in selection.hosts if h.name in sessions)
    # The route lookups run in the workdir, which a host may not have yet (before `fab sync`); the same
    # command reads the port sshd took this very connection on.
    connections = on_each(remote, lambda h: sessions[h.name].run(["printenv", "SSH_CONNECTION"], create_workdir=True,
                                                                 timeout=30).stdout[:200]).require_all()
    # The head may have no session (a join after the first rendezvous host died): its address is still asked for.
    specs = (specs_for(selection, training_interfaces(remote, selection.head, sessions), connections)
             if action is Action.UP else {})
    results = on_each(remote, lambda h: _on_host(sessions[h.name], h, host_request(action, specs.get(h.name))),
                      timeout=HOST_LIMIT_S + 10)
    return results.require_all()


def report(action: Action, answers: Mapping[str, HostAnswer], renderer: Renderer) -> None:
    for name, answer in answers.items():
        for note in answer.notes:
            renderer.warn(f"{name}: {note}")
        if action is Action.STATUS:
            rules = [ln for ln in answer.output.splitlines() if ln.strip()]
            jumps = sum(1 for argv in answer.ran if "-C" in argv)
            nft = any(argv[:1] == ("nft",) for argv in answer.ran)
            renderer.info(f"{name}: " + ("no meshrun firewall" if not rules else
                                         f"nft table inet meshrun, {len(rules)} line(s)" if nft else
                                         f"{len(rules)} rule line(s), INPUT jumps to it in {jumps} famil(ies)"))
            for line in rules:
                renderer.info(f"  {line}")
        else:
            renderer.info(f"{name}: firewall {action.value} ({len(answer.ran)} command(s) run)")


def firewall(request: FirewallRequest, renderer: Renderer, project: Project) -> int:
    action = parse_action(request.action)
    inventory = load_inventory(inventory_path(request.inventory, project.root), project.root)
    selection = select_hosts(inventory, request.hosts)
    if request.resume:
        selection = selection.resumable()[0]  # as the resume itself moves it (deploy/commands/train.py)
    with sessions_to(selection.hosts, inventory, project.root) as sessions:
        report(action, apply(action, selection, sessions), renderer)
    return 0


@dataclass
class Bracket:
    """One `fab train --firewall` of this process: the joiners `admit` let in, for its DOWN list. A
    joiner reaches the run record only once it started, and a join cut short (the controller
    interrupted during its sync, or the join failed) never does: its chain would stay up. `lock`
    orders an `admit` under way before the DOWN; once `closed`, no `admit` raises a chain."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    admitted: set[str] = field(default_factory=set)
    closed: bool = False


_bracket: Bracket | None = None  # this process's attached --firewall run, while around_run runs and after


def around_run(inventory: str | None, hosts: str | None, detach: bool, run: Callable[[], int], project: Project,
               resume: bool = False) -> int:
    """`fab train --firewall`: the firewall up before the launch and down after it, whatever happens,
    on the selected hosts, on any that joined the run meanwhile (its record, written by this process,
    lists them) and on any host `admit` let in whose join never got that far. A detached run
    outlives this process, so it cannot be bracketed: refused."""
    global _bracket
    if detach:
        raise InputError("--firewall brackets an attached run; for a detached one: fab firewall up, then "
                         "fab train --detach, and fab firewall down when it has ended")
    renderer = Renderer()
    bracket = _bracket = Bracket()
    try:  # `up` inside: hosts it reached before another failed must not keep the chain
        firewall(FirewallRequest(Action.UP.value, inventory, hosts, resume), renderer, project)
        return run()
    finally:
        with bracket.lock:  # an `admit` under way ends its `up` first, and none starts after this
            bracket.closed = True
            admitted = sorted(bracket.admitted)
        joined = [n for r in all_records(project.runs) if r.controller_pid == os.getpid() for n in r.members]
        everyone = ",".join(dict.fromkeys([*(hosts.split(",") if hosts else []), *joined, *admitted])) or hosts
        firewall(FirewallRequest(Action.DOWN.value, inventory, everyone, resume), renderer, project)


@contextlib.contextmanager
def _admitting(joiner: str) -> Iterator[None]:
    """Held around a joiner's `up`: the joiner is on the bracket's DOWN list before its chain rises,
    and a run whose DOWN has begun is joined by no one (its chain would stay up)."""
    bracket = _bracket
    if bracket is None:  # no --firewall run of this process: a detached `fab join`
        yield
        return
    with bracket.lock:
        if bracket.closed:
            raise MeshrunError(f"host '{joiner}': the run is ending and its firewall is being taken down; "
                               "nothing started")
        bracket.admitted.add(joiner)
        yield


def admit(inventory: Inventory, members: tuple[str, ...], head: str, project: Project, renderer: Renderer) -> None:
    """A host joins a --firewall run: every member's chain (the joiner's too) is refilled with the
    members including it, before it starts, or the others would reset its connections."""
    hosts = tuple(inventory.host(name) for name in members)
    selection = Selection(hosts, Rendezvous(head, inventory.rendezvous.port))
    # A member that left or died is not asked (it runs nothing of the run); the joiner must answer.
    sessions, unreachable = open_sessions(hosts, inventory, project.root, DEFAULT_CONNECT_TIMEOUT_S)
    try:
        if members[-1] in unreachable:
            raise unreachable[members[-1]]
        with _admitting(members[-1]):
            report(Action.UP, apply(Action.UP, selection, sessions), renderer)
    finally:
        close_all(sessions)


def release(inventory: Inventory, name: str, project: Project, renderer: Renderer) -> None:
    """A join that failed or was cut short after `admit`: the joiner's chain down again. It runs
    nothing of the run; fenced until the run's end (or for good: a detached join has no end that takes
    chains down), the host would refuse every TCP connection but SSH meanwhile. The members' chains
    keep letting its address in until the run's end: that costs nothing."""
    host = inventory.host(name)
    selection = Selection((host,), Rendezvous(name, inventory.rendezvous.port))
    with sessions_to((host,), inventory, project.root) as sessions:
        report(Action.DOWN, apply(Action.DOWN, selection, sessions), renderer)
    bracket = _bracket
    if bracket is not None:  # down already: the run's end need not reach it (it may be gone by then)
        with bracket.lock:
            bracket.admitted.discard(name)


def main(request: FirewallRequest, project: Project) -> int:
    """`fab firewall`; exit status 0, 1 when a host failed, 2 on bad input."""
    return firewall(request, Renderer(), project)
