"""The exposure check, the edge: a bait listener on every address of each overlay host (the `canary`
mode of deploy/host/links.py), and TCP connects to it from the controller on the host's other
addresses (its `ssh_address`, and the public ones it reports off its overlay interface). Verdicts
in deploy/check/exposure.py. The bait accepts and closes, and exits when its stdin closes or
after CANARY_LIFETIME_S."""

from __future__ import annotations

import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from meshrun.deploy.check.answers import canary_addresses, canary_ports
from meshrun.deploy.check.exposure import (ExposureProbe, ExposureResult, ExposureTarget, exposure_targets, is_probed,
                                           public_addresses)
from meshrun.deploy.edges.check_probes import probe_argv
from meshrun.deploy.edges.fanout import on_each
from meshrun.deploy.edges.host_queries import parse_json_object
from meshrun.deploy.edges.stdinfeed import first_line
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


def _is_own(address: str) -> bool:
    """Whether `address` is one of this machine's: then the controller is a member host, and its
    connects would be let in by any firewall that lets the members in. Only a literal IP address
    counts: a host name would be resolved by the bind, on this thread, with no bound on the lookup."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
        return True
    except (OSError, ValueError):  # not ours
        return False


def _probe_host(session: Session, host: Host, rdzv_port: int | None, local_python: str) -> ExposureProbe:
    """The bait on `host`, then every connect to it at once (each bounded by CONNECT_TIMEOUT_S)."""
    stream = session.start(probe_argv(python_of(host, local_python), "links", "canary",
                                      str(rdzv_port) if rdzv_port is not None else "-", str(CANARY_LIFETIME_S)))
    try:
        answer = parse_json_object(first_line(stream, host.name, "the exposure probe", CANARY_LIFETIME_S)
                                   .decode(errors="replace"))
        if answer is None or "ports" not in answer:
            raise MeshrunError(f"host '{host.name}': the exposure probe did not start")
        ephemeral, rendezvous = canary_ports(host.name, answer, rdzv_port)
        public = public_addresses(host, canary_addresses(host.name, answer))
        targets = exposure_targets(host, ephemeral, rendezvous, public)
        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            states = tuple(pool.map(_state, targets))
        busy = ((host.name, rdzv_port),) if rdzv_port is not None and rendezvous is None else ()
        return ExposureProbe(tuple(map(ExposureResult, targets, states)), busy)
    finally:
        stream.close_stdin()
        if stream.wait(timeout=5) is None:
            stream.abandon()


def probe_exposure(hosts: tuple[Host, ...], head: Host, rdzv_port: int, sessions: Mapping[str, Session],
                   local_python: str) -> ExposureProbe:
    """Each overlay host the check reached (and each `network: public` one, unless this controller is
    itself a host), probed from here: its `ssh_address` (public: its address too) and the public
    addresses it reports. A host whose probe failed is named (its SSH failure is the check's own)."""
    member = any(_is_own(h.address) for h in hosts)
    able = tuple(h for h in hosts if h.name in sessions and is_probed(h, member))
    found = on_each(able, lambda h: _probe_host(sessions[h.name], h, rdzv_port if h.name == head.name else None,
                                                local_python), timeout=CANARY_LIFETIME_S + 30)
    probes = [found.ok[h.name] for h in able if h.name in found.ok]
    return ExposureProbe(tuple(r for p in probes for r in p.results), tuple(b for p in probes for b in p.busy),
                         tuple((name, str(err)) for name, err in found.failed.items()))
