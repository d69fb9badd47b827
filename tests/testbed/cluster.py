"""SimCluster: N simulated SSH hosts on this machine (see package docstring)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from . import homes, inventory, latency, network, sshd, wireguard, zerotier
from .layout import DEFAULT_STATE_DIR, NETNS_RE, Host, StatePaths, hosts
from .proc import alive, argv_of, kill_pids, pids_in_netns, read_pidfile, run, stop, wait_dead
from .requirements import missing_requirements

REPO_ROOT = Path(__file__).resolve().parents[2]


class Process(NamedTuple):
    pid: int
    argv: list[str]


@dataclass
class ClusterState:
    """Persisted in <state>/state.json so another process (the CLI) can drive
    or tear down a cluster it did not start."""

    n: int
    ssh_port: int
    wireguard: bool = False
    passthrough: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DownReport:
    leftovers: list[tuple[str, Process]]  # (netns, process) SIGKILLed by down()
    seconds: float


class SimCluster:
    def __init__(
        self,
        state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
        *,
        python: str = sys.executable,
        repo_root: Path = REPO_ROOT,
        ssh_port: int = 22,
    ) -> None:
        self.paths = StatePaths(Path(state_dir).absolute())
        self.python = python
        self.repo_root = repo_root
        self.ssh_port = ssh_port
        self.last_up_seconds: float | None = None

    # ------------------------------------------------------------ state ----
    def _state(self) -> ClusterState | None:
        try:
            return ClusterState(**json.loads(self.paths.state_file.read_text()))
        except FileNotFoundError:
            return None

    def _save(self, state: ClusterState) -> None:
        self.paths.state_file.write_text(json.dumps(asdict(state), indent=2) + "\n")

    def _require_state(self) -> ClusterState:
        state = self._state()
        if state is None:
            raise RuntimeError(f"no simulated cluster is up (no {self.paths.state_file})")
        return state

    @property
    def hosts(self) -> list[Host]:
        return hosts(self._require_state().n)

    def host(self, i: int) -> Host:
        n = self._require_state().n
        if not 1 <= i <= n:
            raise ValueError(f"host index {i} not in 1..{n}")
        return Host(i)

    @property
    def is_up(self) -> bool:
        return self._state() is not None

    @property
    def wireguard(self) -> bool:
        return self._require_state().wireguard

    @property
    def client_key(self) -> Path:
        return self.paths.client_key

    @property
    def known_hosts(self) -> Path:
        """known_hosts for every host's underlay address (for the ssh CLI)."""
        return self.paths.known_hosts

    @property
    def passthrough(self) -> list[Path]:
        return [Path(p) for p in self._require_state().passthrough]

    def host_key_fingerprint(self, i: int) -> str:
        return sshd.fingerprint(self.paths.host_key(self.host(i)))

    # --------------------------------------------------------- up / down ----
    def up(self, n: int, wireguard: bool = False) -> float:
        """Bring up hosts h1..hN (after cleaning leftovers of a crashed run);
        returns the seconds it took. On failure everything is torn down."""
        missing = missing_requirements(wireguard=wireguard)
        if missing:
            raise RuntimeError("cannot bring up the test bed: " + "; ".join(missing))
        start = time.monotonic()
        report = self.down()
        for netns, proc in report.leftovers:
            print(f"testbed: killed leftover {proc.pid} in {netns}: {proc.argv}", file=sys.stderr)
        all_hosts = hosts(n)
        try:
            self._up(all_hosts)
            if wireguard:
                self.wireguard_up()
        except BaseException:
            self.down()
            raise
        self.last_up_seconds = time.monotonic() - start
        return self.last_up_seconds

    def _up(self, all_hosts: list[Host]) -> None:
        p = self.paths
        p.root.mkdir(parents=True, exist_ok=True)
        sshd.ensure_key(p.client_key, "meshrun-testbed")
        p.authorized_keys.write_text(sshd.public_key(p.client_key) + "\n")
        passthrough = homes.passthrough_dirs(self.python, self.repo_root, extra=[p.root])
        # Save first: a failure from here on leaves things down() must find.
        self._save(ClusterState(n=len(all_hosts), ssh_port=self.ssh_port,
                                passthrough=[str(d) for d in passthrough]))
        network.raise_neighbour_room(len(all_hosts), p.neighbour_sysctls)
        network.create_bridge()
        hosts_text = network.hosts_file_text(all_hosts)
        for h in all_hosts:
            network.create_host_link(h)
            network.write_hosts_file(h, p, hosts_text)
            sshd.ensure_key(p.host_key(h), h.name)
            homes.reset_home(p.home(h), passthrough)
            sshd.start_sshd(h, p, passthrough, self.ssh_port)
        known = []
        for h in all_hosts:
            sshd.wait_ready(h, p, self.ssh_port)
            target = h.address if self.ssh_port == 22 else f"[{h.address}]:{self.ssh_port}"
            known.append(f"{target} {sshd.public_key(p.host_key(h))}")
        p.known_hosts.write_text("\n".join(known) + "\n")
        p.ssh_config.write_text(sshd.ssh_config_text(all_hosts, p, self.ssh_port))

    def down(self) -> DownReport:
        """Remove everything this test bed makes: processes (by pid, only those
        inside our namespaces), namespaces mrt*, the bridge, veths, /etc/netns
        entries. Safe to call at any time, also after a crash."""
        start = time.monotonic()
        state = self._state()
        namespaces = network.own_netns()
        indices = {int(NETNS_RE.match(ns).group(1)) for ns in namespaces}  # type: ignore[union-attr]
        if state is not None:
            indices |= set(range(1, state.n + 1))
        known = [Host(i) for i in sorted(indices)]
        # A pid file may be stale and its pid reused: only stop pids that are
        # inside one of our namespaces.
        owned = {pid for ns in namespaces for pid in pids_in_netns(ns)}
        wireguard.down(known, self.paths, owned)
        zerotier.down(known, self.paths, owned)
        latency.down(known, self.paths, owned)
        for h in known:
            pid = read_pidfile(self.paths.sshd_pid(h))
            if pid is not None and pid in owned:
                stop(pid)
            self.paths.sshd_pid(h).unlink(missing_ok=True)
        leftovers: list[tuple[str, Process]] = []
        for ns in namespaces:
            procs = [Process(pid, argv_of(pid)) for pid in pids_in_netns(ns)]
            kill_pids(proc.pid for proc in procs)
            wait_dead((proc.pid for proc in procs), timeout=5)
            leftovers += [(ns, proc) for proc in procs]
            network.delete_netns(ns)
        for h in known:  # /etc/netns entries whose namespace is already gone
            network.delete_netns(h.netns)
        network.delete_root_links()
        network.restore_neighbour_room(self.paths.neighbour_sysctls)
        self.paths.state_file.unlink(missing_ok=True)
        return DownReport(leftovers, time.monotonic() - start)

    # --------------------------------------------------------- wireguard ----
    def wireguard_up(self) -> None:
        state = self._require_state()
        if state.wireguard:
            return
        try:
            wireguard.up(self.hosts, self.paths)
        except BaseException:
            self.wireguard_down()
            raise
        state.wireguard = True
        self._save(state)

    def wireguard_down(self) -> None:
        state = self._require_state()
        owned = {pid for h in self.hosts for pid in pids_in_netns(h.netns)}
        wireguard.down(self.hosts, self.paths, owned)
        state.wireguard = False
        self._save(state)

    # ---------------------------------------------------------- zerotier ----
    @property
    def zerotier(self) -> zerotier.ZeroTier:
        """The real ZeroTier network over these hosts (`.up()`, `.down()`, faults)."""
        return zerotier.ZeroTier(self.paths, self.hosts)

    # ---------------------------------------------------- shaping, faults ----
    def shape(self, rate: str) -> None:
        """tbf at `rate` (tc syntax, e.g. "20mbit") on both ends of every link."""
        for h in self.hosts:
            network.shape(h, rate)

    def unshape(self) -> None:
        for h in self.hosts:
            network.unshape(h)

    @contextmanager
    def shaped(self, rate: str) -> Iterator[None]:
        """with cluster.shaped("20mbit"): ... (unshapes even on failure)"""
        self.shape(rate)
        try:
            yield
        finally:
            self.unshape()

    @contextmanager
    def profile(self, name: str, *, loss: float | None = None) -> Iterator[latency.Profile]:
        """with cluster.profile("home"): ... rate, RTT and loss of latency.PROFILES on
        every host; removed (rules, delayers, qdiscs) even on failure."""
        chosen = self.apply_profile(name, loss=loss)
        try:
            yield chosen
        finally:
            self.clear_profile()

    def apply_profile(self, name: str, *, loss: float | None = None) -> latency.Profile:
        """Replace any applied profile (and shaping) by `name`; `loss` overrides its loss."""
        return latency.apply(self.hosts, self.paths, latency.lookup(name, loss))

    def clear_profile(self) -> None:
        latency.clear(self.hosts, self.paths)

    @contextmanager
    def link_cut(self, i: int) -> Iterator[None]:
        """with cluster.link_cut(2): ... (heals even on failure)"""
        self.cut(i)
        try:
            yield
        finally:
            self.heal(i)

    def cut(self, i: int) -> None:
        network.set_link(self.host(i), up=False)

    def heal(self, i: int) -> None:
        network.set_link(self.host(i), up=True)

    # --------------------------------------------------------- processes ----
    def _infrastructure(self, h: Host) -> set[int]:
        pids = {read_pidfile(self.paths.sshd_pid(h)), wireguard.pid_of(h, self.paths),
                zerotier.pid_of(h, self.paths), latency.delayer_pid(h, self.paths)}
        return {pid for pid in pids if pid is not None}

    def processes(self, i: int, *, sessions: bool = True) -> list[Process]:
        """(pid, argv) of every live process in host i's namespace except the
        sshd listener, wireguard-go, zerotier-one and the delayer. sessions=False also leaves out sshd's
        per-connection processes (open Fabric/ssh connections)."""
        h = self.host(i)
        infra = self._infrastructure(h)
        found = []
        for pid in pids_in_netns(h.netns):
            if pid in infra:
                continue
            if not sessions and _exe(pid) == sshd.SSHD:
                continue
            found.append(Process(pid, argv_of(pid)))
        return found

    def kill_processes(self, i: int, *, sessions: bool = True, timeout: float = 5) -> list[int]:
        """SIGKILL every non-infrastructure process in host i (like a crash of
        everything the host runs); repeats until none is left, since a dying
        parent may have forked. Returns the pids killed."""
        killed: list[int] = []
        deadline = time.monotonic() + timeout
        while procs := self.processes(i, sessions=sessions):
            killed += kill_pids(p.pid for p in procs)
            wait_dead((p.pid for p in procs), timeout=max(0.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                break
        return sorted(set(killed))

    def _enter(self, i: int) -> list[str]:
        """nsenter prefix into host i as its ssh sessions see it: network, UTS
        (hostname), mount (private /root, its /etc/hosts) of its sshd."""
        h = self.host(i)
        pid = read_pidfile(self.paths.sshd_pid(h))
        if pid is None or not alive(pid):
            raise RuntimeError(f"sshd of {h.name} is not running; cannot enter the host")
        return ["nsenter", "--target", str(pid), "--net", "--uts", "--mount", "--wd=/root", "--"]

    def exec(
        self, i: int, argv: Sequence[str], *, check: bool = True,
        timeout: float | None = 60, input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside host i without ssh; output captured as text."""
        return run([*self._enter(i), *argv], check=check, timeout=timeout, input=input)

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv inside host i in the background (subprocess.Popen kwargs)."""
        return subprocess.Popen([*self._enter(i), *argv], **kwargs)

    def ssh_command(self, *, known_hosts: Path | None = None,
                    connect_timeout: int = 5) -> list[str]:
        """`ssh` plus options (client key, strict host key checking), no target:
        for `rsync -e shlex.join(...)` or to add a target yourself."""
        return ["ssh", "-i", str(self.client_key), "-p", str(self.ssh_port),
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={known_hosts or self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={connect_timeout}"]

    def ssh_argv(self, i: int, *remote: str, known_hosts: Path | None = None,
                 connect_timeout: int = 5) -> list[str]:
        """ssh CLI argv running `remote` on host i (words go to the remote shell)."""
        ssh = self.ssh_command(known_hosts=known_hosts, connect_timeout=connect_timeout)
        return [*ssh, f"root@{self.host(i).address}", "--", *remote]

    # --------------------------------------------------------- inventory ----
    def write_inventory(
        self,
        path: str | os.PathLike[str],
        *,
        known_hosts: bool = True,
        python: str | None = None,
        hosts: Sequence[str] | None = None,
        host_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        defaults_overrides: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        use_zerotier: bool = False,
    ) -> Path:
        """Write a meshrun inventory (and, if known_hosts, its known_hosts file
        next to it: <stem>_known_hosts). Returns the inventory path.
        use_zerotier: `network: zerotier` on the real ZeroTier addresses
        (needs `self.zerotier.up()`), SSH over the LAN."""
        state = self._require_state()
        overlay = "zerotier" if use_zerotier else "wireguard" if state.wireguard else None
        out = Path(path)
        selected = [h for h in self.hosts if hosts is None or h.name in hosts]
        if hosts is not None and len(selected) != len(set(hosts)):
            raise ValueError(f"unknown hosts in {hosts}; have {[h.name for h in self.hosts]}")
        entries = [
            inventory.HostEntry(
                name=h.name,
                address={"zerotier": h.zt_address, "wireguard": h.overlay_address}.get(overlay or "", h.address),
                ssh_address=h.address if overlay else None,
                host_key=sshd.public_key(self.paths.host_key(h)),
            )
            for h in selected
        ]
        kh_path = out.with_name(f"{out.stem}_known_hosts")
        doc = inventory.build(
            entries,
            identity=self.client_key,
            python=python or self.python,
            network=overlay or "lan",
            known_hosts=kh_path,
            host_overrides=host_overrides or {},
            defaults_overrides={"port": self.ssh_port, **(defaults_overrides or {})},
            extra=extra or {},
        )
        inventory.check_workdir(doc, self.passthrough)
        inventory.dump(doc, out)
        if known_hosts:
            kh_path.write_text("\n".join(inventory.known_hosts_lines(doc, entries)) + "\n")
        return out


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
