"""The `ssh` command line rsync runs, agreeing with the controller's own SSH connections.

Every setting comes from `deploy.edges.sshtarget` (inventory, then ssh_config, then root/22) and
goes on the command line; `-F /dev/null` keeps ssh from reading an ssh_config of its own, so it
cannot go elsewhere than paramiko does. rsync names the host by its inventory address;
`HostName=` sends ssh where sshtarget resolved it. A ProxyJump chain becomes nested
`ProxyCommand=ssh ... -W host:port jump`, each with the same strict host-key options (OpenSSH's
own ProxyJump would start a child ssh that takes none of them).

This ssh is a process of its own, so it cannot ride the controller's shared connection to a jump
host (deploy/edges/jumps.py): each rsync through one is a handshake there. It is not capped (the
controller cannot see when a child ssh has logged in, so a slot would last the whole transfer);
a try the jump host turns away before its banner is run again by deploy/edges/rsyncrun.py.
`ConnectionAttempts=` would not help: it repeats only the TCP connect, which sshd had accepted.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from meshrun.deploy.edges import sshtarget
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.model import Host



def ssh_argv(host: Host, known_hosts: Path | None) -> list[str]:
    """`ssh OPTIONS` (no target, no command) for `rsync -e`."""
    target = sshtarget.resolve(host)
    return hop_argv(target.target, target.jumps, common_options(known_hosts))


def common_options(known_hosts: Path | None) -> list[str]:
    """Strict host keys from the inventory's known_hosts and ~/.ssh/known_hosts, never a prompt."""
    files = [known_hosts.resolve()] if known_hosts else []
    files.append(Path(os.path.expanduser("~/.ssh/known_hosts")))
    # GlobalKnownHostsFile: /etc/ssh/ssh_known_hosts is not one of paramiko's files, so rsync's ssh
    # must not trust a key pinned only there either.
    return ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={' '.join(_config_word(f) for f in files)}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={int(sshtarget.CONNECT_TIMEOUT_S)}", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]


def hop_argv(hop: sshtarget.Hop, jumps: tuple[sshtarget.Hop, ...], options: list[str]) -> list[str]:
    """ssh to `hop` through `jumps` (the last one is next to `hop`)."""
    argv = ["ssh", *options, "-p", str(hop.port), "-o", f"HostName={_escape(hop.hostname)}"]
    for key in hop.identities:
        argv += ["-i", _escape(key)]
    if hop.identities:
        argv += ["-o", "IdentitiesOnly=yes"]
    if hop.agent:  # -F /dev/null: ssh would otherwise use $SSH_AUTH_SOCK's agent, as paramiko does without it
        argv += ["-o", f"IdentityAgent={_config_word(Path(hop.agent), 'IdentityAgent')}"]
    if jumps:
        last = jumps[-1]
        proxy = hop_argv(last, jumps[:-1], options) + ["-W", f"{_bracketed(hop.hostname)}:{hop.port}", last.hostname]
        argv += ["-o", f"ProxyCommand={_escape(shlex.join(proxy))}"]
    return argv + ["-l", hop.user]


def _escape(value: str) -> str:
    """ssh expands %-tokens in HostName, ProxyCommand, IdentityFile (-i) and UserKnownHostsFile: keep a
    `%` literal."""
    return value.replace("%", "%%")


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _config_word(path: Path, what: str = "known_hosts") -> str:
    """One path of a space-separated ssh option value: double-quoted when it holds whitespace
    (ssh's option parser honours double quotes; it has no escape for one inside them)."""
    text = _escape(str(path))
    if '"' in text:
        raise InputError(f"{what} path {text!r} holds a double quote, which ssh cannot read; rename it")
    return f'"{text}"' if any(c.isspace() for c in text) else text
