"""`fab firewall up|down|status` (and `fab train --firewall`): meshrun's own chain in each host's
iptables, allowing SSH and the member hosts on the training interface, refusing all other TCP.

The rules are planned here from the inventory (deploy/run/firewall.py) and run on each host by
deploy/host/firewall.py, shipped as `python -c` so it works before `fab sync`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.sessions import sessions_to, training_interfaces
from meshrun.deploy.edges.sshtarget import resolve
from meshrun.deploy.edges.transport import Session, last_json_line
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.selection import Selection, select_hosts
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.answers import said
from meshrun.deploy.run.firewall import (Action, FirewallSpec, HostAnswer, Step, host_answer, member_addresses,
                                          parse_action, ssh_ports, steps_for)
from meshrun.deploy.run.plan import python_of

HOST_LIMIT_S = 120  # a few dozen iptables calls, each bounded on the host


@dataclass(frozen=True)
class FirewallRequest:
    action: str
    inventory: str | None
    hosts: str | None


def specs_for(selection: Selection, interfaces: Mapping[str, str],
              ssh_connections: Mapping[str, str]) -> dict[str, FirewallSpec]:
    """Every selected host allows the same members: the selection's training addresses."""
    members = member_addresses(tuple(h.address for h in selection.hosts))
    # A host alone has no peer to route to: its members are itself, reached on lo (already allowed).
    return {h.name: FirewallSpec(ssh_ports(resolve(h).target.port, ssh_connections.get(h.name, "")),
                                 interfaces.get(h.name, "lo"), members)
            for h in selection.hosts}


def _on_host(session: Session, host: Host, steps: tuple[Step, ...]) -> HostAnswer:
    payload = json.dumps([{"argv": s.argv, "only_if": s.only_if, "unless": s.unless} for s in steps])
    result = session.run(probe_argv(python_of(host, sys.executable), "firewall", payload), timeout=HOST_LIMIT_S)
    try:
        answer = last_json_line(result.stdout)
    except (ValueError, IndexError):
        why = (result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1]
        raise MeshrunError(f"host '{host.name}': the firewall script failed: {said(why)}") from None
    return host_answer(host.name, answer)


def apply(action: Action, selection: Selection, sessions: Mapping[str, Session]) -> dict[str, HostAnswer]:
    """Run `action` on every selected host; raises one line naming every host that failed."""
    remote = tuple(h for h in selection.hosts if not h.is_local)
    if len(remote) != len(selection.hosts):
        raise InputError("fab firewall: a local host is this machine; meshrun does not change its firewall")
    # The route lookups run in the workdir, which a host may not have yet (before `fab sync`); the same
    # command reads the port sshd took this very connection on.
    connections = on_each(remote, lambda h: sessions[h.name].run(["printenv", "SSH_CONNECTION"], create_workdir=True,
                                                                 timeout=30).stdout[:200]).require_all()
    specs = (specs_for(selection, training_interfaces(remote, selection.head, sessions), connections)
             if action is Action.UP else {})
    results = on_each(remote, lambda h: _on_host(sessions[h.name], h, steps_for(action, specs.get(h.name))),
                      timeout=HOST_LIMIT_S + 10)
    return results.require_all()


def report(action: Action, answers: Mapping[str, HostAnswer], renderer: Renderer) -> None:
    for name, answer in answers.items():
        for note in answer.notes:
            renderer.warn(f"{name}: {note}")
        if action is Action.STATUS:
            rules = [ln for ln in answer.output.splitlines() if ln.strip()]
            jumps = sum(1 for argv in answer.ran if "-C" in argv)
            renderer.info(f"{name}: " + ("no meshrun firewall" if not rules else
                                         f"{len(rules)} rule line(s), INPUT jumps to it in {jumps} famil(ies)"))
            for line in rules:
                renderer.info(f"  {line}")
        else:
            renderer.info(f"{name}: firewall {action.value} ({len(answer.ran)} command(s) run)")


def firewall(request: FirewallRequest, renderer: Renderer, project: Project) -> int:
    action = parse_action(request.action)
    inventory = load_inventory(inventory_path(request.inventory, project.root))
    selection = select_hosts(inventory, request.hosts)
    with sessions_to(selection.hosts, inventory, project.root) as sessions:
        report(action, apply(action, selection, sessions), renderer)
    return 0


def around_run(inventory: str | None, hosts: str | None, detach: bool, run: Callable[[], int], project: Project) -> int:
    """`fab train --firewall`: the firewall up before the launch and down after it, whatever happens.
    A detached run outlives this process, so it cannot be bracketed: refused, one line."""
    if detach:
        raise InputError("--firewall brackets an attached run; for a detached one: fab firewall up, then "
                         "fab train --detach, and fab firewall down when it has ended")
    renderer = Renderer()
    try:  # `up` inside: hosts it reached before another failed must not keep the chain
        firewall(FirewallRequest(Action.UP.value, inventory, hosts), renderer, project)
        return run()
    finally:
        firewall(FirewallRequest(Action.DOWN.value, inventory, hosts), renderer, project)


def main(request: FirewallRequest, project: Project) -> int:
    """`fab firewall`; exit status 0, 1 when a host failed, 2 on bad input."""
    return firewall(request, Renderer(), project)
