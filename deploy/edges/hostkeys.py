"""SSH host keys, enforced. Fabric accepts unknown and changed keys silently (AutoAddPolicy, no
known_hosts); meshrun loads the system and the inventory's known_hosts and rejects unknown keys.
A changed key is always an error naming the host and both fingerprints.

Both files are read here, not by paramiko: each must be a regular file of at most KNOWN_HOSTS_MAX bytes
(`known_hosts: /dev/zero` or a FIFO would fill memory or hang), and a line that is not a key is skipped,
as OpenSSH does (paramiko's own reader stops with an exception on bad base64 or a malformed key). Of
two lines for one host and key type, the first wins: ~/.ssh/known_hosts, then the inventory's.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import KNOWN_HOSTS_MAX, read_optional

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
KNOWN_HOSTS_FIX = "point `known_hosts:` at the file `fab trust` writes, or remove it"


def fingerprint(key: paramiko.PKey) -> str:
    """SHA256 fingerprint as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name OpenSSH and paramiko look keys up by: `addr`, or `[addr]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


class UnknownHostKey(paramiko.SSHException):
    """The server's key is in no known_hosts file. Carries the key so `trust` can show it."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Like paramiko's RejectPolicy, but keeps the offered key for the error message. (A host with
    a pinned key of another type never gets here: paramiko raises BadHostKeyException itself.)"""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


def pinned_keys(keys: paramiko.HostKeys, project_file: Path | None) -> paramiko.HostKeys:
    """Add ~/.ssh/known_hosts (skipped when it cannot be read: the inventory's file may still vouch) and
    the inventory's file, if it exists (one that cannot be read is bad input), to `keys`."""
    try:
        _add_lines(keys, read_optional(Path(USER_KNOWN_HOSTS).expanduser(), KNOWN_HOSTS_MAX, "known_hosts", ""))
    except InputError:
        pass
    if project_file is not None:
        _add_lines(keys, read_optional(project_file, KNOWN_HOSTS_MAX, "known_hosts", KNOWN_HOSTS_FIX))
    return keys


def _add_lines(keys: paramiko.HostKeys, data: bytes | None) -> None:
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line)
        except (paramiko.SSHException, InvalidHostKey, ValueError):  # bad base64, a malformed or short key
            continue
        for name in entry.hostnames if entry is not None else ():
            known = keys.lookup(name)
            if known is None or entry.key.get_name() not in known:
                keys.add(name, entry.key.get_name(), entry.key)


def load_known_hosts(client: paramiko.SSHClient, project_file: Path | None) -> None:
    """System known_hosts (~/.ssh/known_hosts) plus the inventory's file, if it exists."""
    pinned_keys(client.get_host_keys(), project_file)
    client.set_missing_host_key_policy(RejectUnknown())


def whose(host: str, jump: str | None) -> str:
    """`host 'h2'`, or `host 'h2': jump host h1` when the key is a ProxyJump hop's."""
    return f"host '{host}'" + (f": jump host {jump}" if jump else "")


def unknown_key_error(host: str, err: UnknownHostKey, known_hosts: Path | None, jump: str | None = None) -> MeshrunError:
    where = str(known_hosts) if known_hosts else "~/.ssh/known_hosts"
    return MeshrunError(
        f"{whose(host, jump)}: unknown SSH host key {fingerprint(err.key)} ({err.key.get_name()}) for "
        f"{err.hostname}, not in {where}; if you trust it, run: fab trust --hosts {host}"
    )


def changed_key_error(host: str, err: paramiko.BadHostKeyException, known_hosts: Path | None,
                      jump: str | None = None) -> MeshrunError:
    where = str(known_hosts) if known_hosts else "~/.ssh/known_hosts"
    known, offered = fingerprint(err.expected_key), fingerprint(err.key)
    if err.key.get_name() != err.expected_key.get_name():
        known, offered = f"{known} ({err.expected_key.get_name()})", f"{offered} ({err.key.get_name()})"
    return MeshrunError(
        f"{whose(host, jump)}: SSH host key CHANGED for {err.hostname}: known {known}, offered {offered}. This may "
        f"be an attack; if the host was reinstalled, delete its line from {where} and run: fab trust --hosts {host}"
    )


def append_known_host(path: Path, name: str, key: paramiko.PKey) -> None:
    """Add one `name keytype base64` line, creating the file; never rewrites existing lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    existing = read_optional(path, KNOWN_HOSTS_MAX, "known_hosts", KNOWN_HOSTS_FIX) or b""
    if existing and not existing.endswith(b"\n"):
        line = "\n" + line
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def known_keys(project_file: Path | None, name: str) -> dict[str, paramiko.PKey]:
    """Key type → key recorded for `name` in ~/.ssh/known_hosts and the inventory's file."""
    return dict(pinned_keys(paramiko.HostKeys(), project_file).lookup(name) or {})
