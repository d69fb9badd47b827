"""The exposure check, the edge: a bait listener on every address of each overlay host (the `canary`
mode of deploy/host/links.py), and TCP connects to it from the controller on the host's other
address. Verdicts in deploy/check/exposure.py. The bait accepts and closes, and exits when its
stdin closes or after CANARY_LIFETIME_S."""

from __future__ import annotations

import socket
from typing import Mapping

from meshrun.deploy.check.exposure import ExposureResult, ExposureTarget, exposed_addresses, exposure_targets
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.host_queries import parse_json_object
from meshrun.deploy.edges.transport import Session
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.run.plan import python_of

CANARY_LIFETIME_S = 30.0
CONNECT_TIMEOUT_S = 3.0


def _state(target: ExposureTarget) -> str:
    try:
        socket.create_connection((target.address, target.port), timeout=CONNECT_TIMEOUT_S).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError:
        return "unreachable"


def _probe_host(session: Session, host: Host, rdzv_port: int | None, local_python: str) -> tuple[ExposureResult, ...]:
    stream = session.start(probe_argv(python_of(host, local_python), "links", "canary",
                                      str(rdzv_port) if rdzv_port is not None else "-", str(CANARY_LIFETIME_S)))
    try:
        answer = parse_json_object(stream.readline().decode(errors="replace"))
        if answer is None or "ports" not in answer:
            raise MeshrunError(f"host '{host.name}': the exposure probe did not start")
        ports = answer["ports"]
        targets = exposure_targets(host, int(ports["ephemeral"]), ports.get("rendezvous"))
        return tuple(ExposureResult(t, _state(t)) for t in targets)
    finally:
        stream.close_stdin()
        if stream.wait(timeout=5) is None:
            stream.abandon()


def probe_exposure(hosts: tuple[Host, ...], head: Host, rdzv_port: int, sessions: Mapping[str, Session],
                   local_python: str) -> tuple[ExposureResult, ...]:
    """Each overlay host with a known off-overlay address, probed from here; hosts whose probe
    could not start are left out (their SSH or Python failure is reported by the check itself)."""
    able = tuple(h for h in hosts if h.name in sessions and exposed_addresses(h))
    results = on_each(able, lambda h: _probe_host(sessions[h.name], h, rdzv_port if h.name == head.name else None,
                                                  local_python), timeout=CANARY_LIFETIME_S + 30)
    return tuple(r for h in able if h.name in results.ok for r in results.ok[h.name])
