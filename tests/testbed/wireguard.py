"""Userspace WireGuard overlay (wireguard-go), full mesh, 10.78.0.(10+i)/24.

Gotchas (NOTES.md §6):
* The kernel has no WireGuard module (`ip link add type wireguard` fails);
  wireguard-go over /dev/net/tun works inside a namespace.
* Run it with `-f`: otherwise it daemonises and the pid we hold is useless.
  Never run `wireguard-go --help`: it creates an interface named "--help".
* Its UAPI socket is /var/run/wireguard/wg0.sock on the shared filesystem, so a
  second wg0 in another namespace fails ("unix socket in use"). Each
  wireguard-go gets its own mount namespace with a tmpfs on /var/run/wireguard,
  and `wg` is run inside that namespace via `nsenter --target PID --net --mount`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

from .layout import WG_IFNAME, WG_PORT, Host, StatePaths
from .proc import ahead_of_the_workload, alive, read_pidfile, run, stop

UAPI_DIR = "/var/run/wireguard"


def wg_argv(pid: int, argv: list[str]) -> list[str]:
    """argv run in the net + mount namespace of the wireguard-go with `pid`."""
    return ["nsenter", "--target", str(pid), "--net", "--mount", "--", *argv]


def _ensure_keys(host: Host, paths: StatePaths) -> str:
    """Private key file (created once, mode 0600); returns the public key."""
    key = paths.wg_key(host)
    if not key.exists():
        private = run(["wg", "genkey"]).stdout
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(private)
    return run(["wg", "pubkey"], input=key.read_text()).stdout.strip()


def _start(host: Host, paths: StatePaths) -> int:
    Path(UAPI_DIR).mkdir(parents=True, exist_ok=True)  # mount point for the tmpfs
    steps = [["mount", "-t", "tmpfs", "none", UAPI_DIR],
             ["exec", "env", "LOG_LEVEL=error", "wireguard-go", "-f", WG_IFNAME]]
    script = " && ".join(shlex.join(step) for step in steps)
    with open(paths.wg_log(host), "wb") as log:
        # `ip netns exec`, `unshare` (no --fork) and `sh -c 'exec ...'` all exec,
        # so the child's pid IS wireguard-go's pid.
        child = subprocess.Popen(
            ["ip", "netns", "exec", host.netns,
             "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=ahead_of_the_workload,
        )
    paths.wg_pid(host).write_text(f"{child.pid}\n")
    return child.pid


# wireguard-go's control socket appeared within 10 s until a CI run (2026-12-02) in which both
# simulated clusters' tests loaded the machine: h3's daemon was alive, its log clean, its socket
# not yet there. A readiness wait, not an assertion: it returns as soon as the socket exists.
def _wait_socket(host: Host, paths: StatePaths, pid: int, timeout: float = 30.0) -> None:
    sock = f"{UAPI_DIR}/{WG_IFNAME}.sock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            break
        if run(wg_argv(pid, ["test", "-S", sock]), check=False).returncode == 0:
            return
        time.sleep(0.05)
    log = paths.wg_log(host).read_text(errors="replace")[-2000:]
    raise RuntimeError(f"wireguard-go on {host.name} did not start:\n{log}")


def up(all_hosts: list[Host], paths: StatePaths) -> None:
    pubkeys = {h.index: _ensure_keys(h, paths) for h in all_hosts}
    pids = {h.index: _start(h, paths) for h in all_hosts}
    for h in all_hosts:
        _wait_socket(h, paths, pids[h.index])
    for h in all_hosts:
        wg = ["wg", "set", WG_IFNAME, "private-key", str(paths.wg_key(h)),
              "listen-port", str(WG_PORT)]
        for peer in all_hosts:
            if peer.index != h.index:
                wg += ["peer", pubkeys[peer.index],
                       "endpoint", f"{peer.address}:{WG_PORT}",
                       "allowed-ips", f"{peer.overlay_address}/32",
                       "persistent-keepalive", "5"]
        run(wg_argv(pids[h.index], wg))
        run(["ip", "-n", h.netns, "addr", "add", f"{h.overlay_address}/24", "dev", WG_IFNAME])
        run(["ip", "-n", h.netns, "link", "set", WG_IFNAME, "up"])


def pid_of(host: Host, paths: StatePaths) -> int | None:
    pid = read_pidfile(paths.wg_pid(host))
    return pid if pid is not None and alive(pid) else None


def down(all_hosts: list[Host], paths: StatePaths, owned: set[int]) -> None:
    """Stop each wireguard-go by pid (only if `owned`, i.e. found inside one of
    our namespaces) and remove its interface."""
    for h in all_hosts:
        pid = pid_of(h, paths)
        if pid is not None and pid in owned:
            stop(pid)
        paths.wg_pid(h).unlink(missing_ok=True)
        # The tun device dies with wireguard-go; delete it in case it did not.
        run(["ip", "-n", h.netns, "link", "del", WG_IFNAME], check=False)
    # UAPI_DIR stays. It looks empty from here even while another test bed's daemons use it (their
    # tmpfs is mounted on it in their own mount namespaces), and removing a directory another
    # namespace has a mount on detaches that mount (Linux >= 3.18): their sockets vanish, and `wg`
    # then falls back to the kernel ("Protocol not supported") or wireguard-go cannot listen. Two CI
    # runs (2026-12-03) failed so, the other pytest worker's test bed going down meanwhile.

