"""The real ZeroTier One daemon on every simulated host: a private, offline network.

h<i> gets 10.79.0.(10+i)/24 on the interface ztmrt0. Recipe (../shared/lab/zerotier/NOTES.md):
* Identities first. h1's becomes the only root of a private planet (`zerotier-one -i initmoon`
  turned into worldType "planet" with h1:9993 as stable endpoint, signed with `-i genmoon`),
  written to every home as `planet` BEFORE the first start: without it the daemon silently uses
  ZeroTier's public roots, which cannot be reached here.
* h1's daemon is also the network controller (the embedded one; JSON API on :9993). The network
  id is h1's address + 000001; every member is authorized with its fixed address.
* local.conf: one fixed UDP port, no secondary port, no UPnP/NAT-PMP, no TCP relay. The local
  API also accepts the bridge's gateway, so this process drives every daemon over the bridge.
* `<home>/devicemap` pins the interface name (else it is derived from the network id).
* The daemon acts on a 5 s tick: joins, addresses, ONLINE and a fresh pair's first ping move in
  5 s steps, so every wait here allows >= 60 s. SIGTERM can take ~5 s.
* A user's `zerotier-cli` is this same binary (`zerotier-one -q`); it must read this host's
  daemon home (authtoken, port), so ~/bin/zerotier-cli is the wrapper `zerotier-one -q -D<home>`,
  the place a user puts a `sudo zerotier-cli` wrapper.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .layout import GATEWAY, ZT_IFNAME, ZT_OVERLAY, ZT_PORT, Host, StatePaths
from .proc import alive, kill_pids, read_pidfile, run, wait_dead
from .requirements import zerotier_binary

NET_SUFFIX = "000001"  # network id = <controller's 10 hex digits><6 hex digits>
READY_TIMEOUT_S = 90.0
# A de-authorized node learns it at its next config request, about once a minute (13-55 s seen).
DENIED_TIMEOUT_S = 120.0
API_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0  # SIGTERM: the daemon leaves at its next tick
CLI_MARKER = "# meshrun test bed: the real zerotier-one"
# urllib would honour http_proxy; the daemons are on the bridge, never behind a proxy.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class ZeroTierNet:
    """The network while it is up; saved in <state>/zerotier.json for other processes."""

    nwid: str
    nodes: dict[int, str]  # host index -> ZeroTier node id (10 hex digits)
    binary: str

    def save(self, paths: StatePaths) -> None:
        paths.zt_state.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def load(paths: StatePaths) -> ZeroTierNet | None:
        try:
            data = json.loads(paths.zt_state.read_text())
        except FileNotFoundError:
            return None
        return ZeroTierNet(data["nwid"], {int(k): v for k, v in data["nodes"].items()}, data["binary"])


class ApiError(RuntimeError):
    pass


def api(host: Host, paths: StatePaths, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    """One call to a daemon's JSON API (its service API, or the controller's on h1)."""
    token = (paths.zt_home(host) / "authtoken.secret").read_text().strip()
    request = urllib.request.Request(
        f"http://{host.address}:{ZT_PORT}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"X-ZT1-Auth": token, "Content-Type": "application/json"})
    try:
        with _HTTP.open(request, timeout=10) as response:
            return json.loads(response.read() or b"null")
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ApiError(f"{method} {path} on {host.name}: {err}") from err


def wait_until(what: str, probe: Callable[[], bool], timeout: float, log: Path | None = None) -> float:
    """Poll `probe` until true; seconds taken. Errors from the probe count as 'not yet'."""
    start = time.monotonic()
    while True:
        try:
            if probe():
                return time.monotonic() - start
        except (ApiError, OSError):
            pass
        if time.monotonic() - start > timeout:
            tail = log.read_text(errors="replace")[-1500:] if log is not None and log.exists() else ""
            raise TimeoutError(f"ZeroTier: no {what} after {timeout:.0f} s" + (f"; log:\n{tail}" if tail else ""))
        time.sleep(0.25)


def executable(binary: Path, state_root: Path) -> Path:
    """The binary, or a 0755 copy in the state dir when it lost its exec bit (never write shared/)."""
    if binary.is_file() and binary.stat().st_mode & 0o111:
        return binary
    copy = state_root / "zerotier-one"
    shutil.copyfile(binary, copy)
    copy.chmod(0o755)
    return copy


def cli_wrapper_text(binary: str, home: Path) -> str:
    return f"#!/bin/sh\n{CLI_MARKER} of this host\nexec {shlex.quote(binary)} -q {shlex.quote(f'-D{home}')} \"$@\"\n"


def install_cli(paths: StatePaths, host: Host, binary: str) -> Path:
    """~/bin/zerotier-cli in the host's private home (where fab check-network looks after PATH)."""
    path = paths.home(host) / "bin" / "zerotier-cli"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cli_wrapper_text(binary, paths.zt_home(host)))
    path.chmod(0o755)
    return path


def _remove_cli(paths: StatePaths, host: Host) -> None:
    path = paths.home(host) / "bin" / "zerotier-cli"
    try:
        if CLI_MARKER in path.read_text():
            path.unlink()
    except (FileNotFoundError, UnicodeDecodeError):
        pass


def _identity(binary: Path, home: Path) -> str:
    """Generate the node's identity (a short proof of work); returns its node id."""
    home.mkdir(parents=True)
    run([binary, "-i", "generate", home / "identity.secret", home / "identity.public"], timeout=60)
    return (home / "identity.public").read_text().split(":", 1)[0]


def _planet(binary: Path, root_home: Path, root: Host) -> bytes:
    """A signed world of type planet whose only root is `root` at its underlay address."""
    world = json.loads(run([binary, "-i", "initmoon", root_home / "identity.public"]).stdout)
    world["worldType"] = "planet"
    for entry in world["roots"]:
        entry["stableEndpoints"] = [f"{root.address}/{ZT_PORT}"]
    with tempfile.TemporaryDirectory(prefix="meshrun-zt-planet-") as tmp:
        Path(tmp, "planet.json").write_text(json.dumps(world))
        # genmoon writes <world id>.moon into the current directory.
        subprocess.run([str(binary), "-i", "genmoon", "planet.json"], cwd=tmp, check=True, capture_output=True,
                       timeout=60)
        signed = next(Path(tmp).glob("*.moon")).read_bytes()
    if signed[:1] != b"\x01":  # World::TYPE_PLANET
        raise RuntimeError("genmoon did not produce a planet (first byte is not 1)")
    return signed


def _configure(home: Path, planet: bytes, nwid: str) -> None:
    (home / "planet").write_bytes(planet)
    settings = {"primaryPort": ZT_PORT, "allowSecondaryPort": False, "portMappingEnabled": False,
                "allowTcpFallbackRelay": False, "allowManagementFrom": [f"{GATEWAY}/32"]}
    (home / "local.conf").write_text(json.dumps({"settings": settings}) + "\n")
    (home / "devicemap").write_text(f"{nwid}={ZT_IFNAME}\n")


def network_config(nwid: str) -> dict[str, Any]:
    """The controller's network: private (members need authorization), IPv4 from the pool only."""
    return {"name": "meshrun-testbed", "private": True, "v4AssignMode": {"zt": True},
            "v6AssignMode": {"zt": False, "6plane": False, "rfc4193": False},
            "ipAssignmentPools": [{"ipRangeStart": f"{ZT_OVERLAY}.1", "ipRangeEnd": f"{ZT_OVERLAY}.254"}],
            "routes": [{"target": f"{ZT_OVERLAY}.0/24", "via": None}]}


class ZeroTier:
    """The ZeroTier network over the cluster's hosts: bring up, fault, repair, tear down."""

    def __init__(self, paths: StatePaths, all_hosts: list[Host]) -> None:
        self.paths = paths
        self.hosts = all_hosts
        self.last_up_seconds: float | None = None

    @property
    def net(self) -> ZeroTierNet:
        net = ZeroTierNet.load(self.paths)
        if net is None:
            raise RuntimeError(f"ZeroTier is not up (no {self.paths.zt_state})")
        return net

    @property
    def is_up(self) -> bool:
        return ZeroTierNet.load(self.paths) is not None

    @property
    def root(self) -> Host:
        return self.hosts[0]

    # ------------------------------------------------------------ up ----
    def up(self) -> float:
        """Start every daemon, create and join the network; returns once every node is OK with its
        address and every pair pings (seconds taken). On failure everything is stopped."""
        start = time.monotonic()
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        self.last_up_seconds = time.monotonic() - start
        return self.last_up_seconds

    def _up(self) -> None:
        binary = executable(zerotier_binary(), self.paths.root)
        nodes = {}
        for h in self.hosts:
            shutil.rmtree(self.paths.zt_home(h), ignore_errors=True)
            nodes[h.index] = _identity(binary, self.paths.zt_home(h))
        planet = _planet(binary, self.paths.zt_home(self.root), self.root)
        net = ZeroTierNet(nodes[self.root.index] + NET_SUFFIX, nodes, str(binary))
        for h in self.hosts:
            _configure(self.paths.zt_home(h), planet, net.nwid)
        net.save(self.paths)  # from here on, down() finds what to stop
        # Root and controller first, so the others' first HELLO is answered at once.
        self.start_daemon(self.root.index, wait=False)
        wait_until("controller", lambda: api(self.root, self.paths, "GET", "/controller") is not None,
                   API_TIMEOUT_S, self.paths.zt_log(self.root))
        api(self.root, self.paths, "POST", f"/controller/network/{net.nwid}", network_config(net.nwid))
        for h in self.hosts:
            self._member(h, {"authorized": True, "ipAssignments": [h.zt_address]})
        for h in self.hosts[1:]:
            self.start_daemon(h.index, wait=False)
        for h in self.hosts:
            self.wait_api(h)
            api(h, self.paths, "POST", f"/network/{net.nwid}", {})  # zerotier-cli join <nwid>
            install_cli(self.paths, h, net.binary)
        self.wait_ready()

    def _member(self, host: Host, body: Mapping[str, Any]) -> None:
        net = self.net
        api(self.root, self.paths, "POST", f"/controller/network/{net.nwid}/member/{net.nodes[host.index]}", body)

    def wait_api(self, host: Host) -> float:
        """Seconds until the host's daemon answers on its API (started, authtoken written)."""
        return wait_until(f"API of {host.name}", lambda: api(host, self.paths, "GET", "/status") is not None,
                          API_TIMEOUT_S, self.paths.zt_log(host))

    # --------------------------------------------------------- state ----
    def network(self, i: int) -> dict[str, Any]:
        """Host i's view of the network (`zerotier-cli -j listnetworks`, this network's entry)."""
        return api(self._host(i), self.paths, "GET", f"/network/{self.net.nwid}")

    def _host(self, i: int) -> Host:
        return next(h for h in self.hosts if h.index == i)

    def node_ok(self, i: int) -> bool:
        h = self._host(i)
        network = self.network(i)
        return (network.get("status") == "OK" and f"{h.zt_address}/24" in network.get("assignedAddresses", [])
                and network.get("portDeviceName") == ZT_IFNAME)

    def pings(self, i: int, j: int) -> bool:
        argv = ["ip", "netns", "exec", self._host(i).netns, "ping", "-c1", "-W1", "-q", self._host(j).zt_address]
        return run(argv, check=False).returncode == 0

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Every node OK with its address on ztmrt0, then every ordered pair pings; seconds taken."""
        start = time.monotonic()
        for h in self.hosts:
            wait_until(f"network OK on {h.name}", lambda i=h.index: self.node_ok(i), timeout, self.paths.zt_log(h))
        for a in self.hosts:
            for b in self.hosts:
                if a != b:
                    wait_until(f"ping {a.name} -> {b.zt_address}", lambda a=a, b=b: self.pings(a.index, b.index),
                               timeout)
        for h in self.hosts:  # ONLINE (contact with the root) shows only at the next tick
            wait_until(f"ONLINE on {h.name}", lambda h=h: api(h, self.paths, "GET", "/status")["online"] is True,
                       timeout)
        return time.monotonic() - start

    def wait_status(self, i: int, status: str, timeout: float = READY_TIMEOUT_S) -> float:
        return wait_until(f"status {status} on h{i}", lambda: self.network(i).get("status") == status, timeout)

    # -------------------------------------------------- faults, repair ----
    def deauthorize(self, i: int) -> float:
        """Untick Auth for host i at the controller; seconds until its node says ACCESS_DENIED."""
        self._member(self._host(i), {"authorized": False})
        return self.wait_status(i, "ACCESS_DENIED", DENIED_TIMEOUT_S)

    def authorize(self, i: int) -> float:
        """Authorize host i again; seconds until the whole network is ready again."""
        h = self._host(i)
        self._member(h, {"authorized": True, "ipAssignments": [h.zt_address]})
        return self.wait_ready()

    def start_daemon(self, i: int, *, wait: bool = True) -> float:
        """Start host i's daemon (its home keeps identity and joined network); with `wait`, seconds
        until the network is ready again."""
        h = self._host(i)
        with open(self.paths.zt_log(h), "ab") as log:
            # `ip netns exec` execs: the child's pid is the daemon's. -U: stay root.
            child = subprocess.Popen(["ip", "netns", "exec", h.netns, self.net.binary, "-U", str(self.paths.zt_home(h))],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.paths.zt_pid(h).write_text(f"{child.pid}\n")
        if not wait:
            return 0.0
        start = time.monotonic()
        self.wait_api(h)
        self.wait_ready()
        return time.monotonic() - start

    def stop_daemon(self, i: int) -> float:
        """SIGTERM host i's daemon (as `systemctl stop zerotier-one`); seconds until it is gone."""
        start = time.monotonic()
        stop_all([self._host(i)], self.paths, owned=None)
        return time.monotonic() - start

    def daemon_pid(self, i: int) -> int | None:
        return pid_of(self._host(i), self.paths)

    def repair(self) -> float:
        """Undo what a test may have left: start stopped daemons, authorize every member, put the
        CLI wrappers back; seconds until the network is ready (about none when it was)."""
        start = time.monotonic()
        net = self.net
        for h in self.hosts:
            install_cli(self.paths, h, net.binary)
            if pid_of(h, self.paths) is None:
                self.start_daemon(h.index, wait=False)
        self.wait_api(self.root)
        for h in self.hosts:
            member = api(self.root, self.paths, "GET", f"/controller/network/{net.nwid}/member/{net.nodes[h.index]}")
            if not member.get("authorized"):
                self._member(h, {"authorized": True, "ipAssignments": [h.zt_address]})
        for h in self.hosts:
            self.wait_api(h)
        self.wait_ready()
        return time.monotonic() - start

    # ---------------------------------------------------------- down ----
    def down(self) -> None:
        down(self.hosts, self.paths, owned=None)


def pid_of(host: Host, paths: StatePaths) -> int | None:
    pid = read_pidfile(paths.zt_pid(host))
    return pid if pid is not None and alive(pid) else None


def stop_all(all_hosts: list[Host], paths: StatePaths, owned: set[int] | None) -> None:
    """SIGTERM the hosts' daemons together (each takes up to a tick to leave), then SIGKILL what is
    left. Only pids in `owned` (inside our namespaces) when given: a stale pid file may name another."""
    pids = [pid for h in all_hosts if (pid := pid_of(h, paths)) is not None and (owned is None or pid in owned)]
    kill_pids(pids, signal.SIGTERM)
    kill_pids(wait_dead(pids, STOP_GRACE_S))
    wait_dead(pids, STOP_GRACE_S)
    for h in all_hosts:
        paths.zt_pid(h).unlink(missing_ok=True)
        # The tap device goes with the daemon; make sure (a killed daemon leaves it a moment).
        run(["ip", "-n", h.netns, "link", "del", ZT_IFNAME], check=False)


def down(all_hosts: list[Host], paths: StatePaths, owned: set[int] | None) -> None:
    """Stop the daemons, remove their homes, the CLI wrappers and the network's state."""
    stop_all(all_hosts, paths, owned)
    for h in all_hosts:
        _remove_cli(paths, h)
        shutil.rmtree(paths.zt_home(h), ignore_errors=True)
    paths.zt_state.unlink(missing_ok=True)
