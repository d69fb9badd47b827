"""`fab check-network`, the edge: runs the probes on hosts over open sessions, returns records.

Every remote step is an argv (quoted by deploy/run/shell.py), bounded in time, and leaves nothing
running: the link listeners exit when their stdin closes or their lifetime ends; the all-reduce
runs under `timeout` on each host. Verdicts are made elsewhere (deploy/check/verdicts.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from meshrun.layout import STATE_REFUSED_EXIT, run_dir
from meshrun.deploy.edges import host_queries as probes, sshtarget

from meshrun.deploy.check import wireguard
from meshrun.deploy.check.answers import Clock, NoClock, clock_of, facts_of, link_results, listener_of, machine_of
from meshrun.deploy.check.linkplan import LINK_CONNECT_S, link_plan, links_limit
from meshrun.deploy.check.linkverdicts import df_targets

from meshrun.deploy.check import zerotier
from meshrun.deploy.errors import MeshrunError
from meshrun.deploy.inventory.shown import shown
from meshrun.deploy.run.answers import said
from meshrun.deploy.edges.fanout import HostResults, on_each
from meshrun.deploy.inventory.model import Host, Inventory, Network, sites_of
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.check.verdicts import (AllReduceBudget, AllReduceResult, Fingerprint, Gpu, HostFacts, LinkResult,
                             PortState, ProbeStatus, RendezvousFacts, errored_links, link_targets)
from meshrun.deploy.check.loginshell import login_noise, non_posix_line
from meshrun.deploy.run.plan import HostLaunch, LaunchOptions, Workload, env_block, plan_launch, python_of
from meshrun.deploy.edges.host_queries import peer_address_for
from meshrun.deploy.edges.stdinfeed import EXEC_WITH_STDIN_ENV, first_line, run_fed
from meshrun.deploy.edges.transport import CommandResult, Session, Stream, connect

PROBE_DIR = Path(__file__).resolve().parents[1] / "host"  # the stdlib probes, shipped as `python -c`
FACTS_TIMEOUT_S = 60  # importing torch on a cold disk takes a while
# The file travels in argv, not on stdin: invoke feeds a remote stdin about 100 bytes per second.
# Written to a temp file beside it and renamed over it: a session cut mid-write (the resume's
# checkpoint manifest) leaves the old file whole, never a truncated one.
WRITE_FILE = """import os, pathlib, sys
p = pathlib.Path(sys.argv[1])
p.parent.mkdir(parents=True, exist_ok=True)
t = p.with_name(".tmp-" + p.name + "." + str(os.getpid()))
try:
    with open(t, "w") as f:
        f.write(sys.argv[2])
        f.flush()
        os.fsync(f.fileno())
    os.replace(t, p)
finally:
    t.unlink(missing_ok=True)
"""


def probe_argv(python: str, probe: str, *args: str) -> list[str]:
    """`python -c <deploy/PROBE.py> ARGS`: the probe travels in the argv, nothing to install."""
    return [python, "-c", (PROBE_DIR / f"{probe}.py").read_text(), *args]


def open_sessions(hosts: tuple[Host, ...], inventory: Inventory, root: Path,
                  timeout: float) -> tuple[dict[str, Session], dict[str, MeshrunError]]:
    """Sessions to the hosts that answer; the others with their error. A dead host costs `timeout`."""
    sshtarget.check_all(hosts)  # a bad ssh_config value is one line before any host is contacted
    results = on_each(hosts, lambda h: connect(h, inventory.known_hosts, root, timeout), timeout=timeout + 5)
    return results.ok, results.failed


def host_facts(session: Session, host: Host, peer: str | None, local_python: str) -> HostFacts:
    """Everything the check learns about one host, in a few commands."""
    start = time.monotonic()
    # `true` prints nothing: what it "printed" came from the login shell's scripts, before every answer.
    quiet = session.run(["true"], timeout=FACTS_TIMEOUT_S, create_workdir=True)
    ssh_ms = round((time.monotonic() - start) * 1000, 1)
    fingerprint, disk_free, tools, (machine, cpus), clock = _fingerprint(session, python_of(host, local_python))
    gpus, gpu_note = _gpus(session, tools.get("nvidia-smi"))
    interface, mtu, interface_error = _interface(session, peer)
    zt = _zerotier(session, tools.get("zerotier-cli")) if host.network is Network.ZEROTIER else None
    wg = _wireguard(session) if host.network is Network.WIREGUARD else None
    return HostFacts(name=host.name, address=host.address, network=host.network.value, reachable=True,
                     ssh_ms=ssh_ms, fingerprint=fingerprint, gpus=gpus, gpu_note=gpu_note, selected_gpus=host.gpus,
                     workdir=host.workdir, disk_free_gib=None if disk_free is None else round(disk_free / 2**30, 1),
                     interface=interface, mtu=mtu, interface_error=interface_error, zerotier=zt, wireguard=wg,
                     machine=machine, cpus=cpus, python_unset=host.python is None and not host.is_local,
                     rsync_missing=not host.is_local and "rsync" in tools and tools["rsync"] is None,
                     login_noise=login_noise(quiet.stdout), login=_login(session), clock=clock)


def _fingerprint(session: Session, python: str) -> tuple[Fingerprint, int | None, dict[str, str],
                                                         tuple[str | None, int | None], Clock | NoClock | None]:
    # Timed: the host reads its clock within this round trip (deploy/check/clocks.py).
    result, sent_at, answered_at = probes.timed_run(session, probe_argv(python, "facts"), FACTS_TIMEOUT_S)
    facts = probes.parse_json_object(result.stdout) if result.ok else None
    if facts is None:
        # A login shell that is not POSIX says so on some line, not always the last (fish ends on a caret).
        last = (result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1]
        reason = non_posix_line(result.stderr) or last
        return Fingerprint(None, error=f"`{python}`: {reason}"), None, {}, (None, None), None
    name = session.host.name
    return (*facts_of(name, facts), machine_of(name, facts), clock_of(name, facts, sent_at, answered_at))


def _login(session: Session) -> str | None:
    """user@host as SSH logs in there (the login shell is that user's); None for a local host."""
    if session.host.is_local:
        return None
    try:
        target = sshtarget.resolve(session.host).target
    except MeshrunError:
        return None
    return f"{target.user}@{target.hostname}"


def _gpus(session: Session, nvidia_smi: str | None) -> tuple[tuple[Gpu, ...], str | None]:
    if nvidia_smi is None:
        return (), "nvidia-smi not found: CPU only"
    result = session.run([nvidia_smi, *probes.NVIDIA_SMI_QUERY], timeout=30)
    if not result.ok:
        return (), f"nvidia-smi failed ({(result.stderr or result.stdout).strip()[:160]}): CPU only"
    return tuple(Gpu(*g) for g in probes.parse_gpus(result.stdout)), None


def _interface(session: Session, peer: str | None) -> tuple[str | None, int | None, str | None]:
    if peer is None:
        return None, None, None
    try:
        interface = probes.route_interface(session, peer)
    except MeshrunError as err:
        return None, None, str(err)
    return interface.name, interface.mtu, None


def _zerotier(session: Session, cli: str | None) -> zerotier.ZeroTierState:
    if cli is None:
        return zerotier.ZeroTierState(error="zerotier-cli not found (searched PATH, ~/bin, /usr/sbin, /usr/local/sbin); "
                                            "install ZeroTier or put a wrapper in ~/bin, see docs/zerotier.md")
    outputs = []
    for sub in zerotier.SUBCOMMANDS:
        result = session.run(zerotier.argv(cli, sub), timeout=20)
        if not result.ok:
            return zerotier.ZeroTierState(error=zerotier.cli_failure(cli, sub, result.stderr or result.stdout))
        outputs.append(result.stdout)
    return zerotier.parse_state(*outputs)


def _wireguard(session: Session) -> wireguard.WireGuardState:
    result = session.run(list(wireguard.ARGV), timeout=20)
    return wireguard.host_state(result.rc, result.stdout, result.stderr)  # aged by the host's clock, not ours


@dataclass
class Listener:
    """A host's running `probe_net listen`: its ephemeral port, and the rendezvous port's state."""

    stream: Stream
    port: int
    rendezvous: str

    def end_by(self, deadline: float) -> None:
        """Wait until `deadline` (monotonic) for it to end once asked (its stdin closed), then drop it."""
        if self.stream.wait(timeout=max(0.0, deadline - time.monotonic())) is None:
            self.stream.abandon()


def start_listener(session: Session, host: Host, rdzv_port: int | None, lifetime: float,
                   local_python: str, bind_only: bool = False) -> Listener:
    """`bind_only`: the rendezvous port bound and let go at once, never served (a successor's)."""
    argv = probe_argv(python_of(host, local_python), "links", "listen", host.address,
                      str(rdzv_port) if rdzv_port is not None else "-", str(lifetime), *(["bind"] if bind_only else []))
    stream = session.start(argv)
    line = first_line(stream, host.name, "the link probe's listener", FACTS_TIMEOUT_S).decode(errors="replace")
    answer = probes.parse_json_object(line)
    try:
        if answer is not None and isinstance(answer.get("error"), str):
            raise MeshrunError(f"cannot listen on {host.address} ({said(answer['error'], 120)}): `address` must be "
                               f"one of {host.name}'s own addresses on the training network; fix it in the inventory")
        if answer is None or "port" not in answer:
            raise MeshrunError(f"host '{host.name}': the link probe did not start "
                               f"({shown(line.strip(), 200) if line.strip() else 'no output'})")
        return Listener(stream, *listener_of(host.name, answer))
    except MeshrunError:
        stream.abandon()
        raise


def probe_links(session: Session, host: Host, targets: list[dict], df_size: int | None, bandwidth_s: float,
                local_python: str, bulk_only: bool = False) -> tuple[LinkResult, ...]:
    """Connect from `host` to every target at once; one LinkResult per target. `df_size`: the
    don't-fragment ping's payload to a target that names none (`df_targets` sizes each by its family).
    `bulk_only`: the timed transfers alone, one target after another (their LinkResults hold only `mbit_s`)."""
    spec = {"targets": targets, "timeout": LINK_CONNECT_S, "df_size": df_size, "bandwidth_s": bandwidth_s,
            "bulk_only": bulk_only}
    result = session.run(probe_argv(python_of(host, local_python), "links", "connect", json.dumps(spec)),
                         timeout=links_limit(len(targets), bandwidth_s))
    try:
        answers = result.last_json()
    except (ValueError, IndexError):
        why = said(result.stderr.strip()[-200:]) or f"exit status {result.rc}, no answer"
        raise MeshrunError(f"host '{host.name}': the link probe failed ({why})") from None
    return link_results(host.name, targets, answers, df_size)


def measure_bandwidth(able: tuple[Host, ...], found: Mapping[str, tuple[LinkResult, ...]],
                       sessions: Mapping[str, Session], bandwidth_s: float,
                       local_python: str) -> dict[tuple[str, str], tuple[float | None, str]]:
    """{(source, target): (Mbit/s, why not measured)} over the open links to ephemeral ports, each
    host's in its probe order (`probe_pairs`). A host whose transfers failed as a whole (its probe
    died, its answer unreadable) gives its links that reason."""
    open_links = {name: [k for k in links if k.state is PortState.OPEN and not k.rendezvous]
                  for name, links in found.items()}

    def transfers(host: Host) -> tuple[LinkResult, ...]:
        targets = [{"name": k.target, "address": k.address, "port": k.port} for k in open_links[host.name]]
        return probe_links(sessions[host.name], host, targets, None, bandwidth_s, local_python, bulk_only=True)

    hosts = [h for h in able if open_links.get(h.name)]
    longest = max((len(open_links[h.name]) for h in hosts), default=0)  # each host's probe has its own limit
    done = on_each(hosts, transfers, timeout=FACTS_TIMEOUT_S + links_limit(longest, bandwidth_s))
    measured = {(k.source, k.target): (k.mbit_s, k.detail if k.mbit_s is None else "")
                for links in done.ok.values() for k in links}
    for name, error in done.failed.items():
        measured.update({(name, k.target): (None, f"the transfers from {name} failed: {error}")
                         for k in open_links[name]})
    return measured


def _with_bandwidth(link: LinkResult, measured: Mapping[tuple[str, str], tuple[float | None, str]]) -> LinkResult:
    mbit_s, why = measured.get((link.source, link.target), (None, ""))
    return replace(link, mbit_s=mbit_s, bandwidth_detail=why)


def rendezvous_facts(head: Host, port: int, listener: Listener) -> RendezvousFacts:
    return RendezvousFacts(head.name, head.address, port, listener.rendezvous)


def bounded_argv(launch: HostLaunch, limit_s: int, local_python: str) -> list[str]:
    """The planned torchrun with the planned environment, killed after `limit_s` whatever happens.
    The inventory's `env` is not on it: `run_fed` sends it on stdin (`env_block`). The host's python
    comes first, where the shell expands a `python: ~/…` (the helper expands it in torchrun's argv)."""
    secret = {k for k, _ in launch.host.env}
    return [python_of(launch.host, local_python), "-c", EXEC_WITH_STDIN_ENV, "timeout", "-k", "5", str(limit_s),
            "env", *(f"{k}={v}" for k, v in launch.env if k not in secret), *launch.torchrun]


def write_files(session: Session, python: str, files: tuple[tuple[str, str], ...]) -> None:
    """Each (path, text) written on the host (WRITE_FILE); the first that fails raises, with its error."""
    for path, text in files:
        result = session.run([python, "-c", WRITE_FILE, path, text], create_workdir=True, timeout=30)
        if not result.ok:
            why = (result.stderr.strip().splitlines() or [f"exit status {result.rc}"])[-1]
            raise MeshrunError(f"host '{session.host.name}': {said(why, 200)}")


def report_order(results: HostResults[CommandResult]) -> list[str]:
    """The hosts in the order the all-reduce's first failure is looked for: host order, but those
    that refused the rendezvous state first. A refusal names the cause; a member that had read the
    honest state only waits out the store for the ones that refused, and fails with a timeout."""
    refused = [name for name, result in results.ok.items() if result.rc == STATE_REFUSED_EXIT]
    return [*refused, *(name for name in results if name not in refused)]


def run_allreduce(selection: Selection, sessions: Mapping[str, Session], interfaces: Mapping[str, str],
                  run_id: str, local_python: str, budget: AllReduceBudget) -> AllReduceResult:
    """deploy/host/allreduce.py under torchrun on every host, from the same plan as `fab train`."""
    hosts = selection.hosts
    # The probe and the script runner travel as files written through argv: the check may run before
    # `fab sync`/`fab setup`, on hosts that have no meshrun yet.
    script, runner = f"{run_dir(run_id)}/probe_allreduce.py", f"{run_dir(run_id)}/runscript.py"
    launcher = f"{run_dir(run_id)}/meshrun_torchrun.py"
    files = ((script, (PROBE_DIR / "allreduce.py").read_text()), (runner, (PROBE_DIR / "runscript.py").read_text()),
             (launcher, (PROBE_DIR / "torchrun.py").read_text()))
    written = on_each(hosts, lambda h: write_files(sessions[h.name], python_of(h, local_python), files), timeout=60)
    for host in hosts:  # a probe that cannot be written fails here, naming why, not as torchrun's "can't open file"
        if isinstance(error := written.get(host.name), MeshrunError):
            why = str(error).removeprefix(f"host '{host.name}': ")
            where = f"{host.workdir.rstrip('/')}/{run_dir(run_id)}"
            return AllReduceResult(ProbeStatus.FAILED, f"host '{host.name}': cannot write the probe's files in "
                                                      f"{where}: {why}")
    options = LaunchOptions(run_id, Workload(script=script, args=(str(budget.pg_timeout_s),), runner=(runner,)),
                            launcher=(launcher,))
    plan = plan_launch(selection, options, interfaces, local_python)
    start = time.monotonic()
    launches = {launch.host.name: launch for launch in plan.hosts}
    results = on_each(hosts, lambda h: run_fed(
        sessions[h.name], bounded_argv(launches[h.name], budget.limit_s, local_python), env_block(h),
        budget.limit_s + 15), timeout=budget.limit_s + 20)
    seconds = round(time.monotonic() - start, 2)
    for name in report_order(results):
        if name in results.failed:
            return AllReduceResult(ProbeStatus.FAILED, str(results.failed[name]), seconds, plan.world_size)
        if not (result := results.ok[name]).ok:
            lines = [ln for ln in (result.stdout + "\n" + result.stderr).splitlines() if ln.strip()]
            why = "did not finish in time" if result.rc == 124 else f"exit status {result.rc}"
            tail = lines[-1].strip()[:240] if lines else "no output"
            return AllReduceResult(ProbeStatus.FAILED, f"{name}: {why}: {tail}; logs in {run_dir(run_id)}/ on each host",
                                   seconds, plan.world_size)
    return AllReduceResult(ProbeStatus.OK, f"world size {plan.world_size}", seconds, plan.world_size)


def gather_facts(hosts: tuple[Host, ...], head: Host, sessions: Mapping[str, Session],
                 unreachable: Mapping[str, MeshrunError], local_python: str) -> tuple[HostFacts, ...]:
    """HostFacts for every selected host, in order; unreachable ones carry their SSH error."""
    addresses = {h.name: h.address for h in hosts}
    live = [h for h in hosts if h.name in sessions]
    multi = len(hosts) > 1 or not head.is_local

    def one(host: Host) -> HostFacts:
        peer = peer_address_for(host.name, head.name, addresses) if multi else None
        return host_facts(sessions[host.name], host, peer, local_python)

    found = on_each(live, one, timeout=FACTS_TIMEOUT_S * 2)
    facts, errors = found.ok, {**unreachable, **found.failed}
    return tuple(facts[h.name] if h.name in facts else
                 HostFacts(h.name, h.address, h.network.value, False, error=str(errors[h.name]), selected_gpus=h.gpus)
                 for h in hosts)


def start_listeners(able: tuple[Host, ...], head: Host, successors: tuple[Host, ...], rdzv_port: int,
                    sessions: Mapping[str, Session], lifetime: float, local_python: str) -> HostResults[Listener]:
    """A listener on each host: the head's also serves the rendezvous port, each successor's binds it
    and lets it go at once (it must not hold a port a run's failover may need while the check goes on)."""
    def start(h: Host) -> Listener:
        successor = h in successors
        return start_listener(sessions[h.name], h, rdzv_port if successor or h.name == head.name else None,
                              lifetime, local_python, bind_only=successor)

    return on_each(able, start, timeout=FACTS_TIMEOUT_S)


@dataclass(frozen=True)
class Probed:
    """What `probe_network` found: the rendezvous port on its host, the links, and each successor's port."""

    rendezvous: RendezvousFacts | None
    links: tuple[LinkResult, ...]
    successors: tuple[RendezvousFacts, ...] = ()  # bound and let go: "free", or why not (deploy/check/ports.py)


def probe_pairs(hosts: tuple[Host, ...], head: Host, rdzv_port: int, sessions: Mapping[str, Session],
                facts: tuple[HostFacts, ...], bandwidth_s: float,
                local_python: str) -> tuple[RendezvousFacts | None, tuple[LinkResult, ...]]:
    """`probe_network` with no successor asked: the rendezvous port on its host and the links."""
    probed = probe_network(hosts, head, rdzv_port, sessions, facts, bandwidth_s, local_python)
    return probed.rendezvous, probed.links


def probe_network(hosts: tuple[Host, ...], head: Host, rdzv_port: int, sessions: Mapping[str, Session],
                  facts: tuple[HostFacts, ...], bandwidth_s: float, local_python: str,
                  successors: tuple[str, ...] = ()) -> Probed:
    """Listeners on every able host (and the rendezvous port on its host; the `successors`' bind it and
    let it go: deploy/check/ports.py), then all-to-all connects; with `bandwidth_s`, once every host's
    handshakes are done, the timed transfers over the open links (linkplan.py's one receiver per host
    at each step). A host whose transfers fail as a whole keeps its links, bandwidth not measured."""
    ok = {f.name for f in facts if f.reachable and f.fingerprint is not None and f.fingerprint.python
          and f.login_noise is None}  # login scripts that print garble every probe's answer: their FAIL says why
    able = tuple(h for h in hosts if h.name in ok and not h.is_local)
    if not able:
        return Probed(None, ())
    # every pair up to 32 hosts, else sampled, by site where the inventory declares sites (linkplan.py)
    plan = link_plan([h.name for h in able], sites_of(able))
    later = tuple(h for h in able if h.name in successors and h.name != head.name)
    started = start_listeners(able, head, later, rdzv_port, sessions, 60 + bandwidth_s * len(hosts) * 3, local_python)
    listeners = started.ok
    stores = tuple(RendezvousFacts(h.name, h.address, rdzv_port, listeners[h.name].rendezvous)
                   for h in later if h.name in listeners)
    try:
        ports = {h.name: (h.address, listeners[h.name].port) for h in able if h.name in listeners}
        rdzv = rendezvous_facts(head, rdzv_port, listeners[head.name]) if head.name in listeners else None
        rdzv_target = (head.address, rdzv_port) if rdzv is not None else None
        mtus = {f.name: f.mtu for f in facts}
        links: list[LinkResult] = []
        for name, error in started.failed.items():  # a host whose listener failed: nobody can reach it, itself included
            target = [{"name": name, "address": next(h.address for h in able if h.name == name), "port": 0}]
            for source in [*ports, name]:
                links += errored_links(source, target, str(error))

        def probe(host: Host) -> tuple[LinkResult, ...]:
            targets = link_targets(host.name, ports, head.name, rdzv_target, plan.peers[host.name])
            mtu = mtus.get(host.name)
            return probe_links(sessions[host.name], host, df_targets(targets, mtu), None, 0.0, local_python)

        results = on_each([h for h in able if h.name in listeners], probe, timeout=FACTS_TIMEOUT_S)
        measured = measure_bandwidth(able, results.ok, sessions, bandwidth_s, local_python) if bandwidth_s else {}
        for name in results:  # in host order
            if name in results.failed:
                links += errored_links(name, link_targets(name, ports, head.name, rdzv_target, plan.peers[name]),
                                       str(results.failed[name]))
            else:
                links += [_with_bandwidth(k, measured) for k in results.ok[name]]
        return Probed(rdzv, tuple(links), stores)
    finally:
        for listener in listeners.values():  # asked all at once, then one wait for all: never 5 s per host
            listener.stream.close_stdin()
        deadline = time.monotonic() + 5
        for listener in listeners.values():
            listener.end_by(deadline)
