"""Named network profiles: bandwidth, round-trip time and loss between simulated hosts.

| profile | per-host link (both directions) | RTT host <-> host | ingress delay per host |
|---------|---------------------------------|-------------------|------------------------|
| lan     | unshaped (~10 Gbit/s veth)      | < 0.2 ms          | none                   |
| home    | 20 Mbit/s                       | 40 ms             | 20 ms                  |
| far     | 50 Mbit/s                       | 150 ms            | 75 ms                  |
| two-site | between sites 20 Mbit/s, inside unshaped | 40 ms between sites, < 0.2 ms inside | 20 ms, from the other site only |
| two-site-far | between sites 50 Mbit/s, inside unshaped | 150 ms between sites | 75 ms, from the other site only |
| three-site | as two-site, between three places | 40 ms between any two sites | 20 ms, from the other sites only |
| nested | as three-site; the first place's LAN 200 Mbit/s | as three-site | as three-site |

The two-site profiles split the hosts into two places, the first half (rounded up) and the rest
(3 hosts: h1, h2 | h3; 4: h1, h2 | h3, h4); three-site into thirds, rounded up likewise (5 hosts:
h1, h2 | h3, h4 | h5), each host with its own 20 Mbit/s to all the other places together (an
office's or a home's uplink, per host): links inside a place are the unshaped LAN, every
packet between places is shaped (htb with one u32 filter per address of the other place, on
both ends of each veth) and delayed by the delayer of the host it enters. The controller sits
in the first place: its packets to the second place are delayed by the full RTT.

`nested` is three-site with a slower LAN in the first place (an office on Wi-Fi, 200 Mbit/s, beside
a datacenter's unshaped veth, ~20 Gbit/s): places nest, and the widest bandwidth gap lies between
the two LANs, not between places (deploy/check/sites.py).

Any profile takes an optional loss rate p: each packet entering a host is
dropped with probability p, so a round trip between two hosts is lost with
probability 1 - (1 - p)^2.

How (the lab kernel has tbf and htb but no netem; NOTES.md §5):

* Bandwidth: tbf on both ends of each host's veth (network.shape), as `shaped()`.
  tbf counts Ethernet frames, so TCP payload gets ~96 % of the rate (1448/1514).
* Delay: every packet entering a host from the bridge (``-i eth0``: never
  loopback) goes to NFQUEUE, where the host's delayer process (delayer.c,
  compiled by `build_delayer`) accepts it a fixed time later, in arrival order.
  Delay is added on ingress only: held on the sender's egress, packets would
  still count against TCP Small Queues and throttle the sender to ~2 packets
  per RTT (NOTES.md §5).
* A host-to-host round trip enters two hosts, so each host delays peers' packets
  by RTT/2. The controller (this machine's root namespace, 10.77.0.1, where ssh,
  Fabric and rsync start) has no delayer of its own: packets *from* it are
  delayed by the full RTT on the host, so controller <-> host round trips see
  the profile's RTT too, like a user whose hosts are far away. SSH and every
  other controller command are therefore as slow as they would be over that WAN:
  that is the point (it is what `fab` has to cope with), not a distortion.
* Overlays (wireguard-go, ZeroTier) run over eth0: their UDP is delayed once,
  the decrypted packets (on wg0 / zt) are not delayed again.
* Rules live in their own chain MRT-DELAY of the *mangle* table (jumped to from
  its INPUT), one NFQUEUE per source class, with ``--queue-bypass``: if the
  delayer is not running, packets pass undelayed instead of being dropped.
  Mangle, not filter: a queued packet's ACCEPT verdict ends the traversal of its
  table's chain, so in filter it would skip the host's own firewall rules (`fab
  firewall`'s MESHRUN chain), or those rules would accept packets before they were
  delayed. Mangle INPUT runs before filter INPUT: every packet is delayed, then
  meets the firewall, as on a real WAN.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import network
from .layout import GATEWAY, NS_IFNAME, UNDERLAY, Host, StatePaths
from .proc import ahead_of_the_workload, alive, pids_in_netns, read_pidfile, run, stop
from .requirements import CC, missing_latency_requirements

CHAIN = "MRT-DELAY"
PEER_QUEUE = 1  # packets from other hosts: RTT/2
CONTROLLER_QUEUE = 2  # packets from the controller: the full RTT
IPTABLES = ("iptables", "-w", "10", "-t", "mangle")  # -w: the xtables lock is machine-wide
DELAYER_SOURCE = Path(__file__).with_name("delayer.c")
DEFAULT_MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class Profile:
    """A network every host gets: link rate, host-to-host RTT, ingress loss rate."""

    name: str
    rate_mbit: int | None  # per host link, both directions; None: unshaped
    rtt_ms: float  # round trip between two hosts (and between controller and a host)
    loss: float = 0.0  # probability that a packet entering a host is dropped
    sites: int = 1  # > 1: rate and RTT apply only between that many places (places())
    first_lan_mbit: int | None = None  # sites > 1: the first place's LAN at this rate; None: unshaped

    @property
    def tc_rate(self) -> str | None:
        return None if self.rate_mbit is None else f"{self.rate_mbit}mbit"

    @property
    def peer_delay_ms(self) -> float:
        """Delay on a host's ingress for packets from other hosts (both ends add it)."""
        return self.rtt_ms / 2

    @property
    def controller_delay_ms(self) -> float:
        """Delay on a host's ingress for packets from the controller (it has no delayer)."""
        return self.rtt_ms

    @property
    def needs_delayer(self) -> bool:
        return self.rtt_ms > 0 or self.loss > 0


PROFILES: tuple[Profile, ...] = (
    Profile("lan", rate_mbit=None, rtt_ms=0.0),
    Profile("home", rate_mbit=20, rtt_ms=40.0),
    Profile("far", rate_mbit=50, rtt_ms=150.0),
    Profile("two-site", rate_mbit=20, rtt_ms=40.0, sites=2),
    Profile("two-site-far", rate_mbit=50, rtt_ms=150.0, sites=2),
    Profile("three-site", rate_mbit=20, rtt_ms=40.0, sites=3),
    Profile("nested", rate_mbit=20, rtt_ms=40.0, sites=3, first_lan_mbit=200),
)


def places(all_hosts: list[Host], sites: int) -> list[list[Host]]:
    """The hosts in `sites` contiguous places, the first ones rounded up: 3 hosts, 2 places: 2 + 1."""
    size = -(-len(all_hosts) // sites)
    return [all_hosts[i:i + size] for i in range(0, len(all_hosts), size)]


def elsewhere(host: Host, all_hosts: list[Host], sites: int) -> list[Host]:
    """The hosts of the other places (all other hosts for a single-place profile)."""
    mine = next(place for place in places(all_hosts, sites) if host in place)
    return [h for h in all_hosts if h not in mine] if sites > 1 else [h for h in all_hosts if h != host]


def site_rules(host: Host, all_hosts: list[Host], sites: int) -> list[list[str]]:
    """`rules()` for a profile of places: only packets from the other places (and, for a host
    outside the first place, from the controller) are queued."""
    queue = ["-j", "NFQUEUE", "--queue-bypass", "--queue-num"]
    first = places(all_hosts, sites)[0]
    out = [[*IPTABLES, "-N", CHAIN]]
    if host not in first:
        out.append([*IPTABLES, "-A", CHAIN, "-s", GATEWAY, *queue, str(CONTROLLER_QUEUE)])
    out += [[*IPTABLES, "-A", CHAIN, "-s", h.address, *queue, str(PEER_QUEUE)]
            for h in elsewhere(host, all_hosts, sites)]
    return [*out, [*IPTABLES, "-I", "INPUT", "-i", NS_IFNAME, "-j", CHAIN]]


def lookup(name: str, loss: float | None = None) -> Profile:
    """The profile called `name`, with its loss rate replaced if `loss` is given."""
    found = [p for p in PROFILES if p.name == name]
    if not found:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(p.name for p in PROFILES)}")
    if loss is None:
        return found[0]
    if not 0 <= loss < 1:
        raise ValueError(f"loss must be in [0, 1), got {loss}")
    return replace(found[0], loss=loss)


def rules() -> list[list[str]]:
    """iptables argv lists (run inside a host) that queue its ingress for the delayer.
    The controller's rule comes first: NFQUEUE ends the chain for a packet."""
    queue = ["-j", "NFQUEUE", "--queue-bypass", "--queue-num"]
    return [
        [*IPTABLES, "-N", CHAIN],
        [*IPTABLES, "-A", CHAIN, "-s", GATEWAY, *queue, str(CONTROLLER_QUEUE)],
        [*IPTABLES, "-A", CHAIN, "-s", f"{UNDERLAY}.0/24", *queue, str(PEER_QUEUE)],
        [*IPTABLES, "-I", "INPUT", "-i", NS_IFNAME, "-j", CHAIN],
    ]


def removal_rules() -> list[list[str]]:
    return [
        [*IPTABLES, "-D", "INPUT", "-i", NS_IFNAME, "-j", CHAIN],
        [*IPTABLES, "-F", CHAIN],
        [*IPTABLES, "-X", CHAIN],
    ]


def compile_argv(source: Path, binary: Path, cc: str = CC) -> list[str]:
    return [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source), "-lnetfilter_queue"]


def build_delayer(paths: StatePaths, cc: str = CC) -> Path:
    """The delayer's binary in the state dir, compiled once per version of its source (named
    by the source's hash: clones of other commits share the state dir). Written under a
    temporary name and renamed: a half-written binary is never started."""
    digest = hashlib.sha256(DELAYER_SOURCE.read_bytes()).hexdigest()[:12]
    binary = paths.root / f"delayer-{digest}"
    if binary.exists():
        return binary
    paths.root.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
    result = subprocess.run(compile_argv(DELAYER_SOURCE, partial, cc), capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"cannot compile {DELAYER_SOURCE}: {result.stderr.strip()[-2000:]}")
    partial.replace(binary)
    return binary


def delayer_argv(binary: Path, profile: Profile, *, seed: int,
                 max_seconds: float = DEFAULT_MAX_SECONDS) -> list[str]:
    return [str(binary),
            "--queue", f"{PEER_QUEUE}:{profile.peer_delay_ms:g}",
            "--queue", f"{CONTROLLER_QUEUE}:{profile.controller_delay_ms:g}",
            "--loss", f"{profile.loss:g}", "--seed", str(seed),
            "--max-seconds", f"{max_seconds:g}"]


def pid_file(host: Host, paths: StatePaths) -> Path:
    return paths.host_dir(host) / "delayer.pid"


def log_file(host: Host, paths: StatePaths) -> Path:
    return paths.host_dir(host) / "delayer.log"


def profile_file(paths: StatePaths) -> Path:
    return paths.root / "profile.json"


def delayer_pid(host: Host, paths: StatePaths) -> int | None:
    """The host's running delayer, if any."""
    pid = read_pidfile(pid_file(host, paths))
    return pid if pid is not None and alive(pid) else None


def current(paths: StatePaths) -> Profile | None:
    """The profile applied now (None: none, i.e. like lan)."""
    try:
        return Profile(**json.loads(profile_file(paths).read_text()))
    except FileNotFoundError:
        return None


def _in(host: Host, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", host.netns, *argv]


def _start_delayer(host: Host, paths: StatePaths, argv: list[str]) -> int:
    with open(log_file(host, paths), "wb") as log:
        # `ip netns exec` execs: the child's pid is the delayer's.
        child = subprocess.Popen(_in(host, argv), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=ahead_of_the_workload)
    pid_file(host, paths).write_text(f"{child.pid}\n")
    return child.pid


def _wait_ready(host: Host, paths: StatePaths, pid: int, timeout: float = 30.0) -> None:
    """Until the delayer has bound its queues (it prints "ready")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        if "ready" in log_file(host, paths).read_text(errors="replace").split():
            return
        time.sleep(0.05)
    log = log_file(host, paths).read_text(errors="replace")[-2000:]
    raise RuntimeError(f"delayer on {host.name} did not start (pid {pid}):\n{log}")


def apply(all_hosts: list[Host], paths: StatePaths, profile: Profile, *,
          cc: str = CC, max_seconds: float = DEFAULT_MAX_SECONDS) -> Profile:
    """Shape and delay every host as `profile`, replacing any profile applied
    before; on failure nothing is left applied. Returns `profile`."""
    missing = missing_latency_requirements(cc) if profile.needs_delayer else []
    if missing:
        raise RuntimeError(f"cannot apply network profile {profile.name}: " + "; ".join(missing))
    clear(all_hosts, paths)
    try:
        _apply(all_hosts, paths, profile, cc, max_seconds)
    except BaseException:
        clear(all_hosts, paths)
        raise
    return profile


def _apply(all_hosts: list[Host], paths: StatePaths, profile: Profile, cc: str,
           max_seconds: float) -> None:
    profile_file(paths).write_text(json.dumps(asdict(profile)) + "\n")
    first = places(all_hosts, profile.sites)[0]
    for h in all_hosts:
        if profile.tc_rate is not None and profile.sites > 1:
            near = [o.address for o in first if o != h] if h in first and profile.first_lan_mbit else []
            network.shape_between(h, [o.address for o in elsewhere(h, all_hosts, profile.sites)], profile.tc_rate,
                                  near, f"{profile.first_lan_mbit}mbit" if near else None)
        elif profile.tc_rate is not None:
            network.shape(h, profile.tc_rate)
    if not profile.needs_delayer:
        return
    binary = build_delayer(paths, cc)
    pids = {h.index: _start_delayer(h, paths, delayer_argv(binary, profile, seed=h.index,
                                                           max_seconds=max_seconds))
            for h in all_hosts}
    for h in all_hosts:
        _wait_ready(h, paths, pids[h.index])
        for argv in (site_rules(h, all_hosts, profile.sites) if profile.sites > 1 else rules()):
            run(_in(h, argv))


def down(all_hosts: list[Host], paths: StatePaths, owned: set[int]) -> None:
    """Stop each host's delayer by pid, only if `owned` (inside one of our
    namespaces), and forget the profile; SimCluster.down() removes the rest with
    the namespaces. SIGTERM: a delayer accepts every packet it holds, then exits."""
    for h in all_hosts:
        pid = delayer_pid(h, paths)
        if pid is not None and pid in owned:
            stop(pid)
        pid_file(h, paths).unlink(missing_ok=True)
    profile_file(paths).unlink(missing_ok=True)


def clear(all_hosts: list[Host], paths: StatePaths) -> None:
    """Remove any profile: rules first (no new packet is queued), then the
    delayers (they release what they hold), then the shaping. Safe to repeat."""
    for h in all_hosts:
        for argv in removal_rules():
            run(_in(h, argv), check=False)
    down(all_hosts, paths, {pid for h in all_hosts for pid in pids_in_netns(h.netns)})
    for h in all_hosts:
        network.unshape(h)
