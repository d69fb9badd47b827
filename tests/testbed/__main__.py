"""Drive the simulated cluster by hand.

    python -m tests.testbed up 3 [--wireguard]     python -m tests.testbed down
    python -m tests.testbed status                 python -m tests.testbed ssh 1 hostname
    python -m tests.testbed exec 1 ip -br addr     python -m tests.testbed inventory inv.yaml
    python -m tests.testbed shape 20mbit | unshape python -m tests.testbed cut 2 | heal 2
    python -m tests.testbed kill 2 | ps 2          python -m tests.testbed wg-up | wg-down
    python -m tests.testbed zt-up | zt-down        (the real ZeroTier One daemon, zerotier.py)
    python -m tests.testbed profile far [--loss 0.01] | profile lan (or unprofile)

`ssh` passes its words to the remote shell, as ssh itself does. Profiles (rate,
RTT, loss on every host): lan, home (20 Mbit/s, 40 ms), far (50 Mbit/s, 150 ms);
see tests/testbed/latency.py. A profile set here stays until `unprofile`, `down`,
or its delayers' --max-seconds.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import latency
from .cluster import SimCluster
from .layout import DEFAULT_STATE_DIR
from .lock import BusyError, exclusive
from .proc import read_pidfile


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="bring up N hosts (cleans leftovers first)")
    up.add_argument("n", type=int)
    up.add_argument("--wireguard", action="store_true", help="add the wireguard-go overlay")
    for name in ("down", "status", "unshape", "wg-up", "wg-down", "unprofile", "zt-up", "zt-down"):
        sub.add_parser(name)
    for name in ("cut", "heal", "kill", "ps"):
        sub.add_parser(name).add_argument("host", type=int)
    for name in ("ssh", "exec"):
        p = sub.add_parser(name)
        p.add_argument("host", type=int)
        p.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("shape").add_argument("rate", help="tc rate, e.g. 20mbit")
    prof = sub.add_parser("profile", help="apply a named network profile to every host")
    prof.add_argument("name", choices=[p.name for p in latency.PROFILES])
    prof.add_argument("--loss", type=float, default=None, help="ingress drop probability")
    prof.add_argument("--max-seconds", type=float, default=latency.DEFAULT_MAX_SECONDS,
                      help="the delayers exit after this (then packets pass undelayed)")
    inv = sub.add_parser("inventory", help="write a meshrun inventory (+ known_hosts)")
    inv.add_argument("path")
    inv.add_argument("--no-known-hosts", action="store_true")
    return parser


def _status(cluster: SimCluster) -> None:
    if not cluster.is_up:
        print("down")
        return
    print(f"{len(cluster.hosts)} hosts, overlay {'on' if cluster.wireguard else 'off'}, "
          f"state {cluster.paths.root}")
    applied = latency.current(cluster.paths)
    if applied is not None:
        print(f"profile {applied.name}: rate {applied.tc_rate or 'unshaped'}, "
              f"RTT {applied.rtt_ms:g} ms, loss {applied.loss:g}")
    for h in cluster.hosts:
        pid = read_pidfile(cluster.paths.sshd_pid(h))
        overlay = f" {h.overlay_address}" if cluster.wireguard else ""
        overlay += f" zt {h.zt_address}" if cluster.zerotier.is_up else ""
        print(f"{h.name} netns={h.netns} {h.address}{overlay} sshd={pid} "
              f"procs={len(cluster.processes(h.index))}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cluster = SimCluster(args.state_dir)
    cmd = args.command
    if cmd in ("up", "down", "zt-up", "zt-down"):
        # Refuse to tear down hosts a pytest session is using (it holds the lock).
        try:
            with exclusive(timeout=0):
                return _run(cluster, args)
        except BusyError as exc:
            print(f"{exc}; not touching it", file=sys.stderr)
            return 1
    return _run(cluster, args)


def _profile(cluster: SimCluster, args: argparse.Namespace) -> None:
    if args.command == "unprofile":
        cluster.clear_profile()
        return
    chosen = latency.apply(cluster.hosts, cluster.paths, latency.lookup(args.name, args.loss),
                           max_seconds=args.max_seconds)
    print(f"profile {chosen.name} on {len(cluster.hosts)} hosts")


def _run(cluster: SimCluster, args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "up":
        seconds = cluster.up(args.n, wireguard=args.wireguard)
        print(f"up: {args.n} hosts in {seconds:.2f}s; "
              f"ssh -F {cluster.paths.ssh_config} h1")
    elif cmd == "down":
        report = cluster.down()
        for netns, proc in report.leftovers:
            print(f"killed leftover {proc.pid} in {netns}: {' '.join(proc.argv)}")
        print(f"down in {report.seconds:.2f}s")
    elif cmd == "status":
        _status(cluster)
    elif cmd == "ssh":
        ssh = cluster.ssh_argv(args.host, *args.argv)
        os.execvp(ssh[0], ssh)
    elif cmd == "exec":
        result = cluster.exec(args.host, args.argv, check=False, timeout=None)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode
    elif cmd == "inventory":
        print(cluster.write_inventory(args.path, known_hosts=not args.no_known_hosts))
    elif cmd == "shape":
        cluster.shape(args.rate)
    elif cmd == "unshape":
        cluster.unshape()
    elif cmd in ("profile", "unprofile"):
        _profile(cluster, args)
    elif cmd == "cut":
        cluster.cut(args.host)
    elif cmd == "heal":
        cluster.heal(args.host)
    elif cmd == "kill":
        print(" ".join(map(str, cluster.kill_processes(args.host))))
    elif cmd == "ps":
        for proc in cluster.processes(args.host):
            print(proc.pid, " ".join(proc.argv))
    elif cmd == "wg-up":
        cluster.wireguard_up()
    elif cmd == "zt-up":
        seconds = cluster.zerotier.up()
        print(f"zerotier: network {cluster.zerotier.net.nwid} up in {seconds:.1f}s; "
              "on a host: ~/bin/zerotier-cli listnetworks")
    elif cmd == "zt-down":
        cluster.zerotier.down()
    elif cmd == "wg-down":
        cluster.wireguard_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
