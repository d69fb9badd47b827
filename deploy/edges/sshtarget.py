"""Where SSH really goes for an inventory host: the inventory, then ssh_config, then root/22.

Fabric reads ~/.ssh/config itself, but it looks up only the address it is given and connects a
ProxyJump hop with its own AutoAddPolicy client (any key accepted). meshrun therefore resolves
ssh_config here, once, and hands Fabric, the key scan of `fab trust` and rsync's ssh the same
explicit answer: every hop with its address, user, port and keys, each checked against the
pinned keys by the caller.

Which `Host` block applies: `ssh_address` when the inventory gives one (as `ssh ADDRESS`
would); else the host's inventory name when ssh_config has a block that says something about
that name (as `ssh gpu1` would); else `address`. The inventory wins wherever it speaks
(`user`, `port`, `identity`); ssh_config fills in where it is silent; then root and 22.
The file is $MESHRUN_SSH_CONFIG, else ~/.ssh/config (/dev/null: none). It is read as a regular file of
at most 1 MiB, and every value meshrun uses from it is checked as the inventory's own are: HostName an
address (never `-o…`, which ssh would read as an option), User a login name, Port ASCII digits from 1 to
65535, IdentityFile printable, and each ProxyJump hop the same; a bad one is one line naming the file,
the Host block and the field (exit status 2). `check_all` resolves every host before any is contacted.
`CanonicalizeHostname` without `CanonicalDomains` changes nothing, as in ssh (paramiko would raise KeyError);
any other error paramiko raises on the file (a Match line shlex cannot split, a CanonicalizeMaxDots that is no
number) is one line naming the file and the Match line or Host looked up (exit status 2).

`Include` is followed as ssh does (paramiko's parser would keep it as an option and ignore it): a
relative path is under ~/.ssh, globs expand sorted, a missing file is skipped, nesting stops at 16. The
included text goes in at the Include line, and the enclosing Host/Match line is repeated after it, so the
lines after an Include stay in their block. One difference from ssh: a Host block inside a file included
from within a Host/Match block applies on its own (ssh applies it only when the enclosing block matches).
`IdentityAgent` names the agent whose keys are offered (`none`: no agent; `SSH_AUTH_SOCK`, or none set:
$SSH_AUTH_SOCK's); ~, %d, %i, %u, %% and a leading $VAR are expanded, any other token is refused. A socket
that is not there is skipped, as ssh does, where the hop has another key (`check_keys`).
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import paramiko

from meshrun.layout import ENV_SSH_CONFIG
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import SSH_CONFIG_MAX, read_optional, regular_file_problem
from meshrun.deploy.inventory.fields import ADDRESS_RE, USER_RE
from meshrun.deploy.inventory.model import Host
from meshrun.deploy.inventory.shown import clip, shown, with_path

DEFAULT_USER = "root"
DEFAULT_PORT = 22
MAX_HOPS = 8  # a longer ProxyJump chain is a mistake, not a network
KEY_MAX = 1 << 20  # a private key file: a few kB
# What a dead host costs: rsync's ssh's ConnectTimeout, and each step of meshrun's own connect (the name's
# lookup and the TCP connect, deploy/edges/dial.py, then the SSH greeting), so a slow resolver costs it too.
CONNECT_TIMEOUT_S = 10.0
DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_dsa")
INCLUDE_DEPTH = 16  # as OpenSSH's READCONF_MAX_DEPTH
AGENT_NONE = "none"  # IdentityAgent none: offer no agent's keys
_INCLUDE = re.compile(r"\s*include(?:\s*=\s*|\s+)(.*)", re.IGNORECASE)
_BLOCK = re.compile(r"\s*(?:host|match)(?:\s*=\s*|\s+)", re.IGNORECASE)
_CANONICALIZE = re.compile(r"\s*canonicalizehostname(?:\s*=\s*|\s+).*", re.IGNORECASE)
# A name no Host pattern but `*` (or a negation) can match: what ssh_config says about every host.
_NOBODY = "meshrun-no-such-host.invalid"


@dataclass(frozen=True)
class Hop:
    """One SSH connection: a jump host or the target itself."""

    label: str  # how messages name it: the alias as the user wrote it
    hostname: str
    user: str
    port: int
    identities: tuple[str, ...]  # key files, ~ expanded; empty: agent and ~/.ssh/id_* (as ssh)
    identity_from: str  # where `identities` were set, for messages; "": nowhere (agent and ~/.ssh/id_*)
    user_defaulted: bool = False  # neither the inventory nor ssh_config named the user: it is DEFAULT_USER
    agent: str = ""  # IdentityAgent's socket, expanded; "": $SSH_AUTH_SOCK (as ssh); AGENT_NONE: no agent


@dataclass(frozen=True)
class SshTarget:
    host: str  # the inventory host's name
    jumps: tuple[Hop, ...]  # in connection order: jumps[0] is reached directly
    target: Hop
    config: Path  # the ssh_config consulted (it may not exist)

    @property
    def hops(self) -> tuple[Hop, ...]:
        return (*self.jumps, self.target)


class _Config(paramiko.SSHConfig):
    """paramiko's lookup of a host that `CanonicalizeHostname yes` (or `always`) applies to raises KeyError
    when no CanonicalDomains is set; ssh then has no domain to try and goes on with the name as given. Such a
    lookup is answered as if the file had no CanonicalizeHostname line (`plain`), which is what ssh does."""

    plain: paramiko.SSHConfig | None = None  # the file without its CanonicalizeHostname lines; None: it has none

    def lookup(self, hostname: str) -> paramiko.config.SSHConfigDict:
        try:
            return super().lookup(hostname)
        except KeyError as err:
            if err.args != ("canonicaldomains",) or self.plain is None:
                raise
        return self.plain.lookup(hostname)


def config_path() -> Path:
    return Path(os.environ.get(ENV_SSH_CONFIG) or "~/.ssh/config").expanduser()


def load_config(path: Path) -> paramiko.SSHConfig:
    """The parsed file with its Includes, or an empty config when there is none (or it is /dev/null,
    as for `ssh -F`)."""
    fix = f"fix the file or set {ENV_SSH_CONFIG}"
    if str(path) == os.devnull:
        return paramiko.SSHConfig()
    lines = _expanded(path, fix, 0)
    if lines is None:
        return paramiko.SSHConfig()
    if sum(len(line) for line in lines) > SSH_CONFIG_MAX:
        raise InputError(with_path("ssh_config ", path, f" with its Include files is larger than "
                                   f"{SSH_CONFIG_MAX >> 20} MiB; {fix}"))
    try:
        config = _Config.from_text("\n".join(lines))
    except paramiko.ConfigParseError as err:
        raise InputError(with_path("", path, f": cannot read ssh_config ({clip(str(err), 80)}); {fix}")) from None
    except ValueError as err:  # paramiko splits a Match line with shlex at parse time and lets its error out
        why = _unsplittable(lines, err)
        raise InputError(with_path("", path, f": cannot read ssh_config ({why}); {fix}")) from None
    if any(_CANONICALIZE.fullmatch(line) for line in lines):
        config.plain = paramiko.SSHConfig.from_text("\n".join(x for x in lines if not _CANONICALIZE.fullmatch(x)))
    return config


def _unsplittable(lines: list[str], err: ValueError) -> str:
    """Which Host/Match line shlex cannot split (an unclosed quote), for the message."""
    for line in lines:
        block = _BLOCK.match(line)
        if block is None:
            continue
        try:
            shlex.split(line[block.end():])
        except ValueError:
            return f"{clip(line.strip(), 60)!r}: {err}"
    return clip(str(err), 80)


def _expanded(path: Path, fix: str, depth: int) -> list[str] | None:
    """The lines of `path` with every Include replaced by the files it names; None when `path` is missing."""
    data = read_optional(path, SSH_CONFIG_MAX, "ssh_config", fix)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(with_path("", path, f": cannot read ssh_config ({clip(str(err), 80)}); {fix}")) from None
    out: list[str] = []
    block = ""  # the Host/Match line the current line is under ("": none yet, every host)
    for line in text.splitlines():
        include = _INCLUDE.fullmatch(line)
        if include is None:
            block = line if _BLOCK.match(line) else block
            out.append(line)
            continue
        if depth + 1 > INCLUDE_DEPTH:
            raise InputError(with_path("ssh_config ", path, f": Include nested deeper than {INCLUDE_DEPTH} "
                                       f"(does it include itself?); {fix}"))
        for name in _include_paths(include.group(1), path, fix):
            included = _expanded(name, fix, depth + 1) or []
            out += included
            if any(_BLOCK.match(x) for x in included):  # ssh goes back to the including block
                out.append(block or "Host *")
    return out


def _include_paths(value: str, path: Path, fix: str) -> list[Path]:
    """The files one Include line names: ~ expanded, relative ones under ~/.ssh, globs sorted."""
    try:
        words = shlex.split(value)
    except ValueError:
        raise InputError(with_path("ssh_config ", path, f": Include {clip(value, 60)!r} has an unclosed "
                                   f"quote; {fix}")) from None
    found: list[Path] = []
    for word in words:
        name = os.path.join(os.path.expanduser("~/.ssh"), os.path.expanduser(word))
        found += [Path(p) for p in sorted(glob.glob(name))] if glob.has_magic(name) else [Path(name)]
    return found


def check_all(hosts: Iterable[Host]) -> None:
    """Resolve every remote host now: a bad ssh_config value is one line before any host is contacted."""
    path = config_path()
    config = load_config(path)
    for host in hosts:
        if not host.is_local:
            resolve(host, config, path)


def resolve(host: Host, config: paramiko.SSHConfig | None = None, path: Path | None = None) -> SshTarget:
    """Every hop to `host` as the inventory and ssh_config say. Raises InputError on a ProxyCommand
    (meshrun cannot check the keys behind it) or a jump chain that loops or runs too long."""
    path = path or config_path()
    config = config if config is not None else load_config(path)
    alias = _alias(host, config, path)
    options = _lookup(config, alias, host.name, path)
    _refuse_proxycommand(host.name, alias, options, path)
    said = Said(host.name, alias, path)
    hostname = options["hostname"]
    if not host.ssh_address and alias == host.name and hostname == host.name:
        hostname = host.address  # the block names the host but sets no HostName
    else:
        said.check("HostName", hostname)
    identities = (os.path.expanduser(host.identity),) if host.identity else _config_keys(options, said)
    where = ("`identity` in the inventory" if host.identity
             else f"IdentityFile for Host {alias} in {path}" if identities else "")
    user = host.user or said.user(options)
    target = Hop(alias, hostname, user or DEFAULT_USER, host.port or said.port(options) or DEFAULT_PORT, identities,
                 where, user is None, said.agent(options))
    jumps = tuple(_jump(host.name, spec, config, path, target) for spec in _jump_specs(host, options, path))
    return SshTarget(host.name, jumps, target, path)


def _refuse_proxycommand(host_name: str, alias: str, options: paramiko.config.SSHConfigDict, path: Path) -> None:
    """A ProxyCommand, the target's or a jump host's, runs a program meshrun cannot check keys behind."""
    if options.get("proxycommand", "none").lower() != "none":
        raise InputError(f"host '{host_name}': {path} sets a ProxyCommand for {alias}; meshrun cannot pin the keys "
                         "behind it: use ProxyJump instead")


def _lookup(config: paramiko.SSHConfig, alias: str, host_name: str, path: Path) -> paramiko.config.SSHConfigDict:
    """`config.lookup(alias)`, whose errors on values the file holds are one line: a CanonicalizeMaxDots that is
    no number (ValueError), CanonicalDomains none of which resolves with CanonicalizeFallbackLocal no
    (paramiko's CouldNotCanonicalize, ssh's "Could not resolve host")."""
    try:
        return config.lookup(alias)
    except (KeyError, ValueError, paramiko.SSHException) as err:
        why = clip(" ".join(f"{type(err).__name__}: {err}".split()), 80)
        raise InputError(with_path(f"host '{host_name}': ", path, f": ssh_config cannot be applied to Host "
                                   f"{shown(alias)} ({why}); fix the file or set {ENV_SSH_CONFIG}")) from None


def _alias(host: Host, config: paramiko.SSHConfig, path: Path) -> str:
    if host.ssh_address:
        return host.ssh_address
    named, everyone = _lookup(config, host.name, host.name, path), _lookup(config, _NOBODY, host.name, path)
    named_says = {k: v for k, v in named.items() if k != "hostname"} != \
        {k: v for k, v in everyone.items() if k != "hostname"} or named["hostname"] != host.name
    return host.name if named_says else host.address


@dataclass(frozen=True)
class Said:
    """What one Host block of ssh_config says, checked as the inventory's own values are."""

    host: str  # the inventory host's name
    alias: str  # the Host block looked up
    path: Path

    def fail(self, key: str, value: str, expected: str) -> InputError:
        return InputError(with_path(f"host '{self.host}': ", self.path, f": {key} {shown(value)} for Host "
                                    f"{shown(self.alias)} is not {expected}; fix ssh_config or set it in the inventory"))

    def check(self, key: str, value: str) -> str:
        if key == "HostName" and not (ADDRESS_RE.fullmatch(value) and not value.startswith("-")):
            raise self.fail(key, value, "a host name or IP address")
        if key == "User" and not USER_RE.fullmatch(value):
            raise self.fail(key, value, "a login name")
        if key == "IdentityFile" and not (value.isprintable() and value.strip()):
            raise self.fail(key, value, "a key file's path")
        return value

    def user(self, options: paramiko.config.SSHConfigDict) -> str | None:
        return self.check("User", options["user"]) if "user" in options else None

    def agent(self, options: paramiko.config.SSHConfigDict) -> str:
        """IdentityAgent's socket with ~, %d, %i, %u, %% and a leading $VAR expanded as ssh does (gpg-agent's
        /run/user/%i/gnupg/S.gpg-agent.ssh); other tokens refused."""
        value = options.get("identityagent", "SSH_AUTH_SOCK")
        if value == "SSH_AUTH_SOCK":
            return ""
        if value.lower() == AGENT_NONE:
            return AGENT_NONE
        if value.startswith("$"):
            name = value[1:].strip("{}")
            if not os.environ.get(name):
                raise InputError(with_path(f"host '{self.host}': ", self.path, f": IdentityAgent {shown(value)} for "
                                           f"Host {shown(self.alias)} names ${name}, which is unset; export it"))
            value = os.environ[name]
        elif re.search(r"%([^diu]|$)", value.replace("%%", "")) or not (value.isprintable() and value.strip()):
            raise InputError(with_path(f"host '{self.host}': ", self.path, f": IdentityAgent {shown(value)} for Host "
                                       f"{shown(self.alias)} is not a socket path (meshrun expands ~, %d, %i, %u and "
                                       "%% only); write the path out"))
        value = os.path.expanduser(value) if value.startswith("~") else value
        return value.replace("%%", "\0").replace("%d", os.path.expanduser("~")).replace(
            "%u", getpass.getuser()).replace("%i", str(os.getuid())).replace("\0", "%")

    def port(self, options: paramiko.config.SSHConfigDict) -> int | None:
        return port_number(options["port"], lambda: self.fail("Port", options["port"], "a port number (1-65535)")) \
            if "port" in options else None


def port_number(text: str, refuse: Callable[[], InputError]) -> int:
    """ASCII digits from 1 to 65535 (`int()` would take '٣' and ' 22')."""
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 0 < int(text) < 65536):
        raise refuse()
    return int(text)


def _config_keys(options: paramiko.config.SSHConfigDict, said: Said) -> tuple[str, ...]:
    return tuple(os.path.expanduser(said.check("IdentityFile", k)) for k in options.get("identityfile", []))


def _jump_specs(host: Host, options: paramiko.config.SSHConfigDict, path: Path) -> list[str]:
    value = options.get("proxyjump", "none")
    specs = [] if value.lower() == "none" else [s.strip() for s in value.split(",") if s.strip()]
    if len(specs) > MAX_HOPS:
        raise InputError(f"host '{host.name}': {path}: ProxyJump lists {len(specs)} hops; at most {MAX_HOPS}")
    return specs


def _jump(host_name: str, spec: str, config: paramiko.SSHConfig, path: Path, target: Hop) -> Hop:
    """`[user@]host[:port]` (or ssh://...) of a ProxyJump list, itself looked up in ssh_config.
    A jump host's own ProxyJump is not followed: list every hop in the target's ProxyJump."""
    user, name, port = _split_spec(spec.removeprefix("ssh://"), Said(host_name, target.label, path))
    options = _lookup(config, name, host_name, path)
    _refuse_proxycommand(host_name, name, options, path)
    said = Said(host_name, name, path)
    keys = _config_keys(options, said)
    where = f"IdentityFile for Host {name} in {path}" if keys else target.identity_from
    user = user or said.user(options)
    return Hop(name, said.check("HostName", options["hostname"]), user or DEFAULT_USER,
               port or said.port(options) or DEFAULT_PORT, keys or target.identities, where, user is None,
               said.agent(options))


def _split_spec(spec: str, said: Said) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` of one ProxyJump hop, each part checked (`said`: the target's Host block)."""
    user, _, rest = spec.rpartition("@")
    port: int | None = None
    if rest.startswith("["):
        name, _, tail = rest[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif rest.count(":") == 1:
        name, _, port_text = rest.partition(":")
    else:
        name, port_text = rest, ""
    if port_text:
        port = port_number(port_text, lambda: said.fail("ProxyJump", spec, "[user@]host[:port] with a port 1-65535"))
    if user and not USER_RE.fullmatch(user) or not (ADDRESS_RE.fullmatch(name) and not name.startswith("-")):
        raise said.fail("ProxyJump", spec, "[user@]host[:port] with a login name and a host name or address")
    return user or None, name, port


def check_keys(target: SshTarget, count: int | None = None) -> None:
    """Fail early, naming the key and where it was set, when one of the first `count` hops (all by
    default) has no key to offer: a missing IdentityFile, or none set with no agent and no ~/.ssh/id_*
    (paramiko would blame sshd). An IdentityAgent socket that is not there is skipped, as ssh skips it
    (the hop's agent gives no keys, deploy/edges/sshopen.SocketAgent); it fails only when it was the
    hop's one source of keys."""
    for hop in target.hops[:count]:
        for key in hop.identities:
            problem = regular_file_problem(Path(key), KEY_MAX) or (None if Path(key).is_file() else "does not exist")
            if problem is not None:  # paramiko would read a FIFO for ever, /dev/zero into memory
                raise MeshrunError(f"host '{target.host}': SSH key {key} for {hop.label} {problem}; it is set by "
                                   f"{hop.identity_from}: point it at your private key")
        if hop.identities or has_default_key(hop.agent):
            continue
        if agent_missing(hop.agent):
            raise MeshrunError(f"host '{target.host}': IdentityAgent {hop.agent} for Host {hop.label} in "
                               f"{target.config} does not exist, and no other key is set; start that agent "
                               "(1Password, Secretive, ...) or fix IdentityAgent")
        agent = "IdentityAgent none" if hop.agent == AGENT_NONE else "no ssh-agent"
        raise MeshrunError(f"host '{target.host}': no SSH key to offer {hop.label} (no `identity` in the "
                           f"inventory, no IdentityFile for Host {hop.label} in {target.config}, {agent}, "
                           "no ~/.ssh/id_*); set `identity: ~/.ssh/<key>` in the inventory")


def agent_missing(agent: str) -> bool:
    """IdentityAgent names a socket path that is not there."""
    return agent not in ("", AGENT_NONE) and not Path(agent).exists()


def has_default_key(agent: str = "") -> bool:
    """What paramiko tries when no key is named: the agent (IdentityAgent's where its socket is there, else
    $SSH_AUTH_SOCK's), then ~/.ssh/id_*."""
    if agent != AGENT_NONE and not agent_missing(agent) and (agent or os.environ.get("SSH_AUTH_SOCK")):
        return True
    return any((Path("~/.ssh").expanduser() / name).is_file() for name in DEFAULT_KEYS)
