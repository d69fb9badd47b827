"""`fab check-network`, pure part: the facts gathered from hosts and links → findings → one report.

Records are frozen dataclasses, so `--json` is `dataclasses.asdict(report)` and tests compare
findings by equality. Nothing here touches the network (see deploy/edges/check_probes.py for that).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum
from typing import Collection, Iterable, Mapping

from meshrun.deploy.check import loginshell, wireguard, zerotier
from meshrun.deploy.check.clocks import Clock, NoClock, clock_findings
from meshrun.deploy.check.findings import Finding, Level, fail, warn, worst
from meshrun.deploy.check.linkplan import link_plan
from meshrun.deploy.check.linkverdicts import (  # noqa: F401 (the links' records and verdicts, here too for callers)
    LinkResult, PortState, bandwidth_findings, link_findings)
from meshrun.deploy.check.sites import PlaceLinks
from meshrun.deploy.check.wireguard import WireGuardState
from meshrun.deploy.check.zerotier import ZeroTierState

LOW_DISK_GIB = 5.0
CLUSTER = "cluster"


class ProbeStatus(str, Enum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Fingerprint:
    """The host's `python` and what it imports: training needs the same versions everywhere."""

    python: str | None
    torch: str | None = None
    cuda: str | None = None  # torch.version.cuda; None on a CPU build
    nccl: str | None = None
    error: str | None = None  # why torch could not be imported, or the probe failed
    meshrun: str | None = None  # "version (build digest)" of the meshrun it imports; None: none


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int
    uuid: str | None = None  # nvidia-smi's `GPU-…`: which card, across reboots and index shuffles


@dataclass(frozen=True)
class HostFacts:
    name: str
    address: str
    network: str
    reachable: bool
    error: str | None = None  # why SSH failed
    ssh_ms: float | None = None  # one command's round trip over the open connection
    fingerprint: Fingerprint | None = None
    gpus: tuple[Gpu, ...] = ()  # empty: CPU only
    gpu_note: str | None = None  # e.g. "nvidia-smi not found"
    selected_gpus: tuple[int, ...] | None = None
    workdir: str = ""
    disk_free_gib: float | None = None
    interface: str | None = None  # routes to the rendezvous host: NCCL/GLOO_SOCKET_IFNAME
    mtu: int | None = None
    interface_error: str | None = None
    zerotier: ZeroTierState | None = None
    wireguard: WireGuardState | None = None
    machine: str | None = None  # a digest of the kernel's boot id: hosts that share it share CPUs (allreduce_budget)
    cpus: int | None = None  # the CPUs the host's processes may use
    python_unset: bool = False  # a remote host with no `python:` in the inventory: it was given the controller's
    rsync_missing: bool = False  # a remote host whose PATH has no rsync (every sync and fetch needs it)
    processes: int | None = None  # the processes the launch starts here (Host.nproc_per_node); None: not told
    login_noise: str | None = None  # what the login scripts print on stdout before every answer (loginshell.py)
    login: str | None = None  # user@host as SSH logs in: whose login shell runs every command; None: a local host
    clock: Clock | NoClock | None = None  # against this machine's, from the facts probe (clocks.py); None: not read


@dataclass(frozen=True)
class RendezvousFacts:
    host: str
    address: str
    port: int
    listener: str  # "listening", or why the port could not be opened there


ALLREDUCE_LIMIT_S = 90  # rendezvous, gloo init and one all-reduce, each host importing torch on CPUs of its own
ALLREDUCE_PG_TIMEOUT_S = 30
ALLREDUCE_MAX_S = 300
HOSTS_PER_CPU = 2  # as many hosts per CPU as the fixed budget above holds


@dataclass(frozen=True)
class AllReduceBudget:
    limit_s: int  # `timeout` kills the probe after this
    pg_timeout_s: int  # its process group's timeout: a hung collective says so before the kill


def allreduce_budget(facts: Iterable[HostFacts]) -> AllReduceBudget:
    """The all-reduce probe's time. Every host starts torchrun at once and each imports torch twice
    (agent, worker); gloo's init waits for the last worker. Hosts that share a machine (containers,
    the test bed's namespaces: one boot id) do that on the same CPUs. Up to 2 hosts per CPU fit the
    90 s (and the 30 s collective timeout) that the 3-host test bed has always passed in; past that
    both grow with the most crowded machine's hosts per CPU, the limit to at most 300 s. A CI run's
    16-host check (8 hosts per CPU, beside another cluster's tests) ran past the fixed 90 s."""
    crowds: dict[str, list[HostFacts]] = {}
    for host in facts:
        if host.machine is not None:
            crowds.setdefault(host.machine, []).append(host)
    crowding = max((len(hosts) / min(h.cpus or 1 for h in hosts) for hosts in crowds.values()), default=1.0)
    scale = max(1.0, crowding / HOSTS_PER_CPU)
    limit = min(ALLREDUCE_MAX_S, round(ALLREDUCE_LIMIT_S * scale))
    return AllReduceBudget(limit, min(round(ALLREDUCE_PG_TIMEOUT_S * scale), limit - 30))


@dataclass(frozen=True)
class AllReduceResult:
    status: ProbeStatus
    detail: str = ""
    seconds: float | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class CheckReport:
    level: Level
    hosts: tuple[HostFacts, ...]
    rendezvous: RendezvousFacts | None
    links: tuple[LinkResult, ...]
    allreduce: AllReduceResult
    findings: tuple[Finding, ...]
    duration_s: float
    links_rule: str = "every pair"  # which host pairs were probed (deploy/check/linkplan.py)
    places: tuple[PlaceLinks, ...] = ()  # the matrix by declared site (deploy/check/sites.py)


def host_findings(host: HostFacts, cluster_nodes: Mapping[str, str]) -> list[Finding]:
    """Per-host verdicts. `cluster_nodes`: ZeroTier node id → host name for the selected hosts."""
    if not host.reachable:
        return [fail(host.name, host.error or "unreachable over SSH")]
    if shell := loginshell.shell_findings(host.name, host.login, host.login_noise, host.fingerprint and host.fingerprint.error):
        return shell  # it garbles or refuses every command there: the one cause, said alone
    found = _python_findings(host) + _gpu_findings(host)
    if host.interface_error is not None:
        found.append(fail(host.name, host.interface_error))
    if host.rsync_missing:
        found.append(fail(host.name, "rsync not found on the host: meshrun sends code, data and checkpoints with it; "
                                     "install rsync >= 3.2.3 there (apt-get install rsync)"))
    if host.disk_free_gib is not None and host.disk_free_gib < LOW_DISK_GIB:
        found.append(warn(host.name, f"only {host.disk_free_gib:.1f} GiB free in {host.workdir}: checkpoints may not fit"))
    if host.network == "zerotier":
        state = host.zerotier or ZeroTierState(error="not probed")
        others = {node: name for node, name in cluster_nodes.items() if name != host.name}
        found += zerotier.findings(host.name, host.address, state, others, host.interface)
    if host.network == "wireguard":
        found += wireguard.findings(host.name, host.wireguard or WireGuardState(error="not probed"), host.interface)
    return found


def _python_findings(host: HostFacts) -> list[Finding]:
    fp = host.fingerprint
    if fp is None or fp.python is None:
        reason = fp.error if fp is not None and fp.error else "no answer"
        if host.python_unset:
            venv, python = venv_python(host.workdir)
            return [fail(host.name, f"the host's python did not run ({reason}); it has no `python:` in the inventory: "
                                    f"run `fab setup --hosts {host.name}` (it makes {venv}), then set "
                                    f"`python: {python}`")]
        return [fail(host.name, f"the host's python did not run ({reason}); set `python:` in the inventory "
                                "to an interpreter that exists there")]
    if fp.torch is None:
        return [fail(host.name, f"torch is not importable by the host's python {fp.python} ({fp.error or 'missing'}); "
                                "install torch there or point `python:` in the inventory at a venv that has it")]
    return []


def venv_python(workdir: str) -> tuple[str, str]:
    """(the venv `fab setup` makes, in words; the `python:` naming it). Commands run after `cd WORKDIR`
    (deploy/run/shell.py): under a relative workdir, `meshrun/.venv/bin/python` is ~/meshrun/meshrun/…"""
    if workdir.startswith(("/", "~")):
        return f"{workdir.rstrip('/')}/.venv", f"{workdir.rstrip('/')}/.venv/bin/python"
    return f".venv in the workdir {workdir}", ".venv/bin/python"


def launch_gpus(host: HostFacts) -> tuple[int, ...] | None:
    """The GPUs (nvidia-smi's indices) the launch gives this host's processes: `gpus:` as listed;
    else one each, CUDA's first (train/dist.gpu_index), none when the processes outnumber them.
    CUDA counts the fastest first (PCI bus order, nvidia-smi's, among equal cards): None when some
    of mixed cards are used and which cannot be told from here."""
    if host.selected_gpus is not None:
        return host.selected_gpus
    present = sorted(g.index for g in host.gpus)
    count = len(present) if host.processes is None else host.processes
    if count > len(present):
        return ()
    return None if count < len(present) and len({g.name for g in host.gpus}) > 1 else tuple(present[:count])


def _gpu_findings(host: HostFacts) -> list[Finding]:
    present = sorted(g.index for g in host.gpus)
    missing = [i for i in host.selected_gpus or () if i not in present]
    if missing:
        have = ", ".join(str(i) for i in present) or "none (CPU only)"
        return [fail(host.name, f"GPU index(es) {', '.join(map(str, missing))} selected but not present "
                                f"(GPUs: {have}); fix `gpus:` in the inventory or the `--hosts NAME:0,1` override")]
    fp = host.fingerprint
    if present and launch_gpus(host) != () and fp is not None and fp.torch is not None and fp.cuda is None:
        # torch.cuda is unavailable to a CPU build: every rank trains on CPU, and nothing else says so.
        pin = f"torch=={fp.torch.split('+')[0]}+cuXYZ"
        return [warn(host.name, f"torch {fp.torch} is a build without CUDA: {host.name} trains on CPU and its GPUs "
                                "stay idle; to use them, put `--extra-index-url "
                                f"https://download.pytorch.org/whl/cuXYZ` and `{pin}` in requirements.txt, XYZ a CUDA "
                                "its driver runs "
                                "(https://pytorch.org/get-started/locally/), and run "
                                f"`fab setup --hosts {host.name}`; or point `python:` in the inventory at an env with "
                                "a CUDA build")]
    return _process_findings(host, present)


def _process_findings(host: HostFacts, present: list[int]) -> list[Finding]:
    """Without `gpus:`, `nproc:` (else 1) processes take one GPU each: fewer leave GPUs idle, more
    leave every one idle (one GPU per process or none: train/dist.gpu_index)."""
    count, have = host.processes, len(present)
    if host.selected_gpus is not None or count is None or not present or count == have:
        return []
    every = f"`gpus: [{', '.join(map(str, present))}]`"
    processes = f"{count} process{'' if count == 1 else 'es'}"
    if count > have:
        return [warn(host.name, f"{processes} but {have} GPU{'' if have == 1 else 's'} here and no `gpus:` in the "
                                "inventory: one GPU per process or none, so it trains on CPU (on dist.backend=gloo "
                                f"they share the GPUs); set `nproc: {have}`, or list {every} in its place")]
    used = launch_gpus(host)
    which = (f"{'one GPU' if count == 1 else f'{count} GPUs'} (the fastest, by CUDA's count)" if used is None else
             f"GPU{'' if count == 1 else 's'} {', '.join(map(str, used))}")
    return [warn(host.name, f"{have} GPUs here but {processes} (no `gpus:` in the inventory): the run trains on "
                            f"{which} and leaves the others idle; set {every} to use them all")]


def version_findings(hosts: Iterable[HostFacts]) -> list[Finding]:
    """FAIL when torch (its public version: a `+cpu` build beside `+cu` ones is the same torch), NCCL
    (only where every host trains on CUDA: one CPU rank makes the job gloo's) or python (major.minor)
    differ: collectives hang or corrupt across versions."""
    facts = [h for h in hosts if h.fingerprint is not None and h.fingerprint.torch is not None]
    prints, nccl = {h.name: h.fingerprint for h in facts}, all(h.gpus and h.fingerprint.cuda for h in facts)  # type: ignore
    found, python = [], lambda f: ".".join((f.python or "").split(".")[:2])  # 3.11.7 → 3.11: same pickle, bytecode
    for what, key, shown in (("torch", lambda f: f.torch.split("+")[0], lambda f: f.torch),
                             ("NCCL", lambda f: f.nccl if nccl else None, lambda f: f.nccl), ("python", python, python)):
        if len({key(fp) for fp in prints.values()}) > 1:
            listed = ", ".join(f"{name} {shown(fp) or 'none'}" for name, fp in prints.items())
            found.append(fail(CLUSTER, f"{what} versions differ ({listed}); install the same version on every host "
                                       "(mismatched collectives hang or return garbage)"))
    return found


def rendezvous_findings(rdzv: RendezvousFacts) -> list[Finding]:
    if rdzv.listener == "listening":
        return []
    return [fail(rdzv.host, f"rendezvous port {rdzv.port} cannot be opened on {rdzv.host}: {rdzv.listener}; "
                            "another process holds it (a run in progress?): stop it or change `rendezvous.port`")]


def is_public(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return False


def public_findings(rdzv: RendezvousFacts, network: str) -> list[Finding]:
    """The c10d store has no authentication or encryption: on a public address anyone may join, so
    the address decides, not the label: `lan` is the default, which a user of two cloud machines
    never writes. An overlay's address is judged by its own checks (its route, its assignment)."""
    if network in ("zerotier", "wireguard") or not is_public(rdzv.address):
        return []
    fix = ("firewall it to your hosts" if network == "public" else
           "set `network: public` and run `fab firewall up` (it lets only your hosts in)")
    return [warn(CLUSTER, f"the rendezvous is on public address {rdzv.address}:{rdzv.port} ({rdzv.host}) with "
                          f"`network: {network}`: the c10d store (TCPStore) is unauthenticated and unencrypted, and "
                          "object collectives unpickle, so anyone who reaches the port can run code on your hosts; "
                          f"{fix} or use an overlay (docs/public-ip.md, docs/zerotier.md)")]


def allreduce_findings(result: AllReduceResult) -> list[Finding]:
    if result.status is not ProbeStatus.FAILED:
        return []
    return [fail(CLUSTER, f"the gloo all-reduce, started as training would be, failed: {result.detail}")]


def local_findings(hosts: Iterable[HostFacts]) -> list[Finding]:
    hosts = list(hosts)
    if len(hosts) < 2:
        return []
    return [fail(h.name, "`address: local` cannot be reached by other hosts; give it its LAN or overlay address "
                         "to use it in a multi-host run") for h in hosts if h.address == "local"]


def has_failures(found: Iterable[Finding]) -> bool:
    return any(f.level is Level.FAIL for f in found)


def build_report(hosts: tuple[HostFacts, ...], rdzv: RendezvousFacts | None, links: tuple[LinkResult, ...],
                 allreduce: AllReduceResult, network: str, duration_s: float,
                 sites: Mapping[str, str | None] | None = None, elastic: bool = False) -> CheckReport:
    """All findings in a stable order: hosts, versions, clocks, rendezvous, links, end to end. `sites`: each
    host's `site:`, which the link plan's rule follows past 32 hosts (deploy/check/linkplan.py). `elastic`:
    the run regroups, so clocks too far apart FAIL (deploy/check/clocks.py)."""
    nodes, dups = zerotier.node_names(((h.name, h.zerotier.node) for h in hosts if h.zerotier is not None), CLUSTER)
    found = [f for h in hosts for f in host_findings(h, nodes)] + dups + local_findings(hosts) + version_findings(hosts)
    found += clock_findings({h.name: h.clock for h in hosts}, elastic)
    if rdzv is not None:
        found += rendezvous_findings(rdzv) + public_findings(rdzv, network)
    found += link_findings(links, {h.name: h.mtu for h in hosts}) + bandwidth_findings(links)
    found += allreduce_findings(allreduce)
    sources = list(dict.fromkeys(link.source for link in links if not link.rendezvous))  # the probing hosts, in order
    return CheckReport(worst(f.level for f in found), hosts, rdzv, links, allreduce, tuple(found), round(duration_s, 2),
                       link_plan(sources, sites).rule)


def link_targets(source: str, ports: Mapping[str, tuple[str, int]], head: str | None,
                 rdzv: tuple[str, int] | None, peers: Collection[str] | None = None) -> list[dict]:
    """What `source` connects to: the rendezvous port (if its host listens), then the ephemeral
    listener of every other host, or of its `peers` only and in their order (deploy/check/linkplan.py).
    `ports`: host → (address, ephemeral port)."""
    targets = []
    if head is not None and rdzv is not None:
        targets.append({"name": head, "address": rdzv[0], "port": rdzv[1], "rendezvous": True})
    order = ports if peers is None else peers
    targets += [{"name": name, "address": ports[name][0], "port": ports[name][1]}
                for name in order if name != source and name in ports]
    return targets


def errored_links(source: str, targets: list[dict], detail: str) -> tuple[LinkResult, ...]:
    """Links that could not be probed because a probe failed: FAIL with its reason."""
    return tuple(LinkResult(source, t["name"], t["address"], t["port"], PortState.ERROR,
                            rendezvous=bool(t.get("rendezvous")), detail=detail) for t in targets)
