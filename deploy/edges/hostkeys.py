"""SSH host keys, enforced. Fabric accepts unknown and changed keys silently (AutoAddPolicy, no
known_hosts); meshrun loads the system and the inventory's known_hosts and rejects unknown keys.
A changed key is always an error naming the host and both fingerprints.

Both files are read here, not by paramiko: each must be a regular file of at most KNOWN_HOSTS_MAX bytes
(`known_hosts: /dev/zero` or a FIFO would fill memory or hang), and a line that is not a key is skipped,
as OpenSSH does (paramiko's own reader stops with an exception on bad base64 or a malformed key), and
so is a hashed name (`|1|salt|hash`) whose salt is not one (paramiko's lookup asserts on it).

Of two lines for one host and key type, the first wins: ~/.ssh/known_hosts, then the inventory's. The
user's own file comes first because the inventory's is a project file (shared, committed, appended to
by `fab trust --yes`): it may add pins, never overrule one the user holds. When the two disagree the
connection is refused, and the error names the file and line of every pin that differs from the
offered key (`Pin`), and any file that already pins the offered key: the user decides which is stale.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Pin:
    """One known_hosts line that pins `key` for a name: where it is, so a message can say which line to delete."""
    file: str  # as messages show it: ~/.ssh/known_hosts, or the inventory's file
    line: int  # 1-based
    key: paramiko.PKey


def pin_files(project_file: Path | None) -> tuple[str, ...]:
    """The files keys are looked up in, in reading order, as messages show them."""
    return (USER_KNOWN_HOSTS, *((str(project_file),) if project_file is not None else ()))


def _sources(project_file: Path | None) -> Iterator[tuple[str, bytes | None]]:
    """(shown name, contents) of ~/.ssh/known_hosts (skipped when it cannot be read: the inventory's file
    may still vouch), then of the inventory's file, if it exists (one that cannot be read is bad input)."""
    try:
        yield USER_KNOWN_HOSTS, read_optional(Path(USER_KNOWN_HOSTS).expanduser(), KNOWN_HOSTS_MAX, "known_hosts", "")
    except InputError:
        pass
    if project_file is not None:
        yield str(project_file), read_optional(project_file, KNOWN_HOSTS_MAX, "known_hosts", KNOWN_HOSTS_FIX)


def _entries(data: bytes | None) -> Iterator[tuple[int, HostKeyEntry]]:
    """(line number, entry) of each line that is a usable key."""
    for number, line in enumerate((data or b"").decode("utf-8", "replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line)
        except (paramiko.SSHException, InvalidHostKey, ValueError):  # bad base64, a malformed or short key
            continue
        if entry is not None and all(_salt_ok(name) for name in entry.hostnames):
            yield number, entry


def _salt_ok(name: str) -> bool:
    """False for a hashed name whose salt is not 20 bytes of base64: paramiko asserts on it."""
    if not name.startswith("|1|"):
        return True
    try:
        paramiko.HostKeys.hash_host("", name)
        return True
    except (AssertionError, binascii.Error, IndexError, ValueError):
        return False


def _matches(name: str, entry: HostKeyEntry) -> bool:
    """`name` is one of the entry's names, plain or hashed (as paramiko's lookup matches them)."""
    return any(h == name or (h.startswith("|1|") and hmac.compare_digest(paramiko.HostKeys.hash_host(name, h), h))
               for h in entry.hostnames)


def pinned_keys(keys: paramiko.HostKeys, project_file: Path | None) -> paramiko.HostKeys:
    """Add the lines of ~/.ssh/known_hosts and the inventory's file to `keys`; the first line for a
    name and key type wins (the module's docstring says why)."""
    for _shown, data in _sources(project_file):
        for _number, entry in _entries(data):
            for name in entry.hostnames:
                known = keys.lookup(name)
                if known is None or entry.key.get_name() not in known:
                    keys.add(name, entry.key.get_name(), entry.key)
    return keys


def pins_for(project_file: Path | None, name: str) -> tuple[Pin, ...]:
    """Every line that pins a key for `name`, in reading order (the first of each key type is the one
    connections check against, as `pinned_keys` adds them)."""
    return tuple(Pin(shown, number, entry.key) for shown, data in _sources(project_file)
                 for number, entry in _entries(data) if _matches(name, entry))


def load_known_hosts(client: paramiko.SSHClient, project_file: Path | None) -> None:
    """System known_hosts (~/.ssh/known_hosts) plus the inventory's file, if it exists."""
    pinned_keys(client.get_host_keys(), project_file)
    client.set_missing_host_key_policy(RejectUnknown())


def whose(host: str, jump: str | None) -> str:
    """`host 'h2'`, or `host 'h2': jump host h1` when the key is a ProxyJump hop's."""
    return f"host '{host}'" + (f": jump host {jump}" if jump else "")


def unknown_key_error(host: str, err: UnknownHostKey, known_hosts: Path | None, jump: str | None = None) -> MeshrunError:
    return MeshrunError(
        f"{whose(host, jump)}: unknown SSH host key {fingerprint(err.key)} ({err.key.get_name()}) for "
        f"{err.hostname}, not in {' or '.join(pin_files(known_hosts))}; if you trust it, run: fab trust --hosts {host}"
    )


def changed_key_error(host: str, err: paramiko.BadHostKeyException, known_hosts: Path | None,
                      jump: str | None = None, pins: tuple[Pin, ...] | None = None) -> MeshrunError:
    """`pins`: the lines for `err.hostname` (`pins_for`), read again when not given: the advice names the
    line to delete, which is not always in the inventory's file (a stale ~/.ssh/known_hosts line wins)."""
    if pins is None:
        try:
            pins = pins_for(known_hosts, err.hostname)
        except InputError:  # the file changed since it was read: name the files, not a line
            pins = ()
    known, offered = fingerprint(err.expected_key), fingerprint(err.key)
    if err.key.get_name() != err.expected_key.get_name():
        known, offered = f"{known} ({err.expected_key.get_name()})", f"{offered} ({err.key.get_name()})"
    return MeshrunError(
        f"{whose(host, jump)}: SSH host key CHANGED for {err.hostname}: known {known}, offered {offered}. This may "
        f"be an attack; if the host was reinstalled or its address reused, {delete_advice(pins, err.key, known_hosts)} "
        f"and run: fab trust --hosts {host}"
    )


LINES_SHOWN = 5  # line numbers named per file; a file with more lines for one host is named with `…`


def delete_advice(pins: tuple[Pin, ...], offered: paramiko.PKey, known_hosts: Path | None) -> str:
    """`delete line 3 of ~/.ssh/known_hosts (inv/known_hosts:1 already pins the offered key)`: every line
    pinning another key for the host must go before the offered one is accepted."""
    stale: dict[str, list[int]] = {}
    for pin in pins:
        if pin.key.asbytes() != offered.asbytes():
            stale.setdefault(pin.file, []).append(pin.line)
    if not stale:
        return f"delete its line from {' or '.join(pin_files(known_hosts))}"
    parts = [f"line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines[:LINES_SHOWN]))}"
             f"{', …' if len(lines) > LINES_SHOWN else ''} of {file}" for file, lines in stale.items()]
    vouching = [f"{pin.file}:{pin.line}" for pin in pins if pin.key.asbytes() == offered.asbytes()]
    also = f" ({', '.join(vouching)} already pins the offered key)" if vouching else ""
    return "delete " + " and ".join(parts) + also


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


def first_pins(pins: tuple[Pin, ...]) -> dict[str, Pin]:
    """Key type → the pin a connection checks against: the first line of that type (as `known_keys`)."""
    first: dict[str, Pin] = {}
    for pin in pins:
        first.setdefault(pin.key.get_name(), pin)
    return first
