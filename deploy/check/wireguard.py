"""WireGuard state, pure: `wg show all latest-handshakes` → records → findings.

Each output line is `interface<TAB>peer public key<TAB>unix time of the last handshake` (0: never).
The times are the host's, so a handshake's age is taken with the host's own clock, which `ARGV`
prints after them (`date +%s`): the controller's clock, an hour off the host's, made a handshake
5 s old look an hour old.
WireGuard only handshakes when there is traffic, and a session is renewed every 2 minutes, so an
old or missing handshake is reported but is not a failure by itself: the pair probes decide.
Reading it needs CAP_NET_ADMIN (root); an unreadable state is a warning that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshrun.deploy.check.findings import Finding, fail, warn

WG_ARGV = ("wg", "show", "all", "latest-handshakes")
# `wg`'s exit status kept (127: not installed), the host's time on the last line whatever it printed.
ARGV = ("sh", "-c", '"$@"; rc=$?; date +%s; exit $rc', "sh", *WG_ARGV)
FRESH_S = 180  # REJECT_AFTER_TIME: older sessions are gone and need a new handshake


@dataclass(frozen=True)
class WgPeer:
    interface: str
    peer: str  # public key
    handshake_age_s: int | None  # None: never


@dataclass(frozen=True)
class WireGuardState:
    peers: tuple[WgPeer, ...] = ()
    error: str | None = None


def parse_handshakes(text: str, now: int) -> tuple[WgPeer, ...]:
    peers = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not re.fullmatch(r"[0-9]{1,19}", parts[2].strip()):
            continue  # `²`.isdigit() is true, but int() refuses it: ASCII digits only
        stamp = int(parts[2])
        peers.append(WgPeer(parts[0], parts[1], max(0, now - stamp) if stamp else None))
    return tuple(peers)


def state_from(rc: int, stdout: str, stderr: str, now: int) -> WireGuardState:
    if rc == 127:
        return WireGuardState(error="`wg` not found (apt-get install wireguard-tools)")
    if rc != 0:
        reason = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {rc}"
        hint = "; reading WireGuard state needs root (CAP_NET_ADMIN): log in as root or allow `wg show` via sudo"
        return WireGuardState(error=reason + (hint if "ermission" in reason or "not permitted" in reason else ""))
    return WireGuardState(parse_handshakes(stdout, now))


def host_state(rc: int, stdout: str, stderr: str) -> WireGuardState:
    """The state from `ARGV`'s answer: the handshakes, aged by the host's clock (its last line)."""
    lines = stdout.rstrip("\n").split("\n")
    clock = lines[-1].strip()
    if rc == 0 and not re.fullmatch(r"[0-9]{1,19}", clock):
        return WireGuardState(error=f"the host's clock (`date +%s`) gave no time: {clock[:40]!r}")
    return state_from(rc, "\n".join(lines[:-1]), stderr, int(clock) if rc == 0 else 0)


def findings(host: str, state: WireGuardState, interface: str | None = None) -> list[Finding]:
    """`interface`: the one the host's training traffic leaves by (`ip route get` to the rendezvous
    host, from it to the next host); None when not known. Not one that `wg show all` lists means
    `address:` names no WireGuard address (a public or LAN one): the job would run beside the tunnel,
    in clear text, and the exposure check would take that interface for the overlay's."""
    if state.error is not None:
        return [warn(host, f"WireGuard state unreadable: {state.error}")]
    if not state.peers:
        return [warn(host, "`wg show` lists no WireGuard peers: is the tunnel up on this host?")]
    listed = sorted({p.interface for p in state.peers})
    if interface is not None and interface not in listed:
        return [fail(host, f"traffic to the rendezvous host leaves via {interface}, not a WireGuard interface "
                           f"({', '.join(listed)}): training would run outside the tunnel, unencrypted; set `address:` "
                           f"in the inventory to each host's WireGuard address (the one on {listed[0]} there)")]
    return []


def summary(state: WireGuardState) -> str:
    """`wg0: 2 peers, handshakes 3 s, never ago` for the host table."""
    if state.error is not None:
        return "unreadable"
    ages = ", ".join("never" if p.handshake_age_s is None else f"{p.handshake_age_s} s" for p in state.peers)
    interfaces = ",".join(sorted({p.interface for p in state.peers})) or "-"
    return f"{interfaces}: {len(state.peers)} peer(s), handshakes {ages or '-'}"
