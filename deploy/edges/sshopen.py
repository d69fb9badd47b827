"""Opening one SSH hop, and every way it fails said in one line that names the host and what to do.

The connection itself (Fabric's, with meshrun's host-key policy and an empty ssh_config), how a
failed open becomes a MeshrunError (deploy/edges/transport.py's SshSession opens each hop through
`open_hop`), and the pieces of `fab trust`'s key scan: the byte stream to a hop and the handshake
that fetches its key without logging in. Name resolution and the TCP connect are deploy/edges/
dial.py's: bounded, and a server that accepts and never speaks is told from one that is not there.
"""

from __future__ import annotations

import base64
import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

import fabric
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from meshrun.deploy.edges import hostkeys, jumps, sshtarget
from meshrun.deploy.edges.dial import SaidNothing, Unresolved, dial, heard_nothing, said_nothing
from meshrun.deploy.edges.jumps import HopConnection, JumpConnection
from meshrun.deploy.errors import MeshrunError

# How often an open session's paramiko thread wakes when nothing arrives (paramiko: 0.1 s). Data
# wakes it at once and a close does not wait for it; a wake only looks for a close or a due rekey.
# At 0.1 s, 16 idle sessions cost the controller 6.5-8.5 ms of CPU a second, at 1 s 1.4-1.6 (stop 35):
# a thousand would take half a core at 0.1 s. (An attached run's sessions are seldom idle: its
# heartbeats and link probes every 2 s wake them; there the controller's CPU hardly changes.)
TRANSPORT_POLL_S = 1.0


@dataclass(frozen=True)
class Opening:
    """Whose hop is opened, for the messages: the inventory host, its pins and its ssh_config."""

    host: str
    known_hosts: Path | None
    config: Path
    timeout: float


def connection(hop: sshtarget.Hop, gateway: fabric.Connection | None, known_hosts: Path | None,
               timeout: float, kind: type[HopConnection] = HopConnection) -> HopConnection:
    """A Fabric connection to one hop with meshrun's host-key policy. An empty SSHConfig keeps
    Fabric from reading ssh_config itself (sshtarget did) and building its own ProxyJump client,
    which would accept any key; `gateway=False` means: no gateway at all."""
    kwargs: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout}
    if hop.identities:
        kwargs["key_filename"] = list(hop.identities)
    if hop.agent == sshtarget.AGENT_NONE:
        kwargs["allow_agent"] = False
    conn = kind(hop.hostname, user=hop.user, port=hop.port, connect_timeout=timeout,
                connect_kwargs=kwargs, gateway=gateway if gateway is not None else False,
                config=fabric.Config(ssh_config=paramiko.SSHConfig()))
    if hop.agent not in ("", sshtarget.AGENT_NONE):
        conn.client = AgentClient(hop.agent)  # before load_known_hosts, which sets the host-key policy on it
    conn._channel_timeout = timeout
    hostkeys.load_known_hosts(conn.client, known_hosts)
    return conn


class AgentClient(paramiko.SSHClient):
    """An SSHClient that offers the keys of the agent at `path` (ssh_config's IdentityAgent).
    paramiko's own `Agent()` reads $SSH_AUTH_SOCK, which is the whole process's: hosts with different
    agents connect at once from threads. paramiko makes that Agent only when `_agent` is None, at each
    connect (a close drops it, and a jump host's connect is retried): so set ours there, every time."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.agent_path = path

    def connect(self, *args: Any, **kwargs: Any) -> None:
        if self._agent is None:
            self._agent = SocketAgent(self.agent_path)
        super().connect(*args, **kwargs)


# How long an agent may take to sign: a hardware key waits for a touch, 1Password for a click. Its key
# listing is answered at once, so it gets CONNECT_TIMEOUT_S. Past either, a wedged or stopped agent is
# named (AgentSilent) instead of blocking the connect, `fab join` and a rejoin thread for ever.
AGENT_SIGN_TIMEOUT_S = 120.0


class AgentSilent(MeshrunError):
    """The agent at an IdentityAgent socket accepted the connection and did not answer in time."""


class SocketAgent(paramiko.agent.AgentSSH):
    """What paramiko.Agent() is, for the socket at `path` rather than $SSH_AUTH_SOCK's: its keys listed,
    none when the socket is not there or refuses (as paramiko treats a dangling $SSH_AUTH_SOCK: the login
    then says which key it lacked). An agent that accepts and then does not answer, the listing within
    CONNECT_TIMEOUT_S or a signature within AGENT_SIGN_TIMEOUT_S, raises AgentSilent naming it.
    SSHClient.close() calls `close()`, which AgentSSH lacks."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(sshtarget.CONNECT_TIMEOUT_S)
            sock.connect(path)
            self._connect(sock)  # as paramiko.Agent() does with $SSH_AUTH_SOCK's socket; bounded as the connect
            sock.settimeout(AGENT_SIGN_TIMEOUT_S)
        except (OSError, paramiko.SSHException):
            self._close()
            sock.close()
        except AgentSilent:
            self._close()
            sock.close()
            raise

    def _send_message(self, msg: Any) -> Any:
        try:
            return super()._send_message(msg)
        except (socket.timeout, TimeoutError):
            waited = self._conn.gettimeout() if self._conn is not None else sshtarget.CONNECT_TIMEOUT_S
            doing = "list its keys" if not self._keys else "sign (a key waiting for a touch or a click?)"
            raise AgentSilent(f"the SSH agent at IdentityAgent {self.path} accepted the connection but did not "
                              f"{doing} within {waited:g} s; restart that agent, or set IdentityAgent to another "
                              "agent or none") from None

    def close(self) -> None:
        self._close()


def login_refused(who: str, target: str, hop: sshtarget.Hop, jump: str | None, config: Path,
                  err: Exception) -> MeshrunError:
    """One line: the user (said to be the default where nothing named it) and where the key came from."""
    where = "`user:` in the inventory" if jump is None else f"User for Host {hop.label} in {config}"
    user = f"user {hop.user} (the default; set {where})" if hop.user_defaulted else "the user"
    if sshtarget.agent_missing(hop.agent):
        agent = f"~/.ssh/id_*: the IdentityAgent socket {hop.agent} is not there"
    elif hop.agent not in ("", sshtarget.AGENT_NONE):
        agent = "the agent at IdentityAgent " + hop.agent
    else:
        agent = "ssh-agent or ~/.ssh/id_*: none is set in the inventory or ssh_config"
    key = hop.identity_from or agent
    return MeshrunError(f"{who}: SSH login to {target} refused ({err}); check {user} and the key ({key}), "
                        "and that the key is in the host's authorized_keys")


# The files paramiko's SSHClient tries after the hop's own (`look_for_keys`, on by default), in its order.
PARAMIKO_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519")


def locked_keys(hop: sshtarget.Hop) -> tuple[str, ...]:
    """The key files paramiko tried for `hop` that it cannot read without a passphrase: its identities,
    then ~/.ssh/id_*. paramiko's error does not say which file it was."""
    tried = (*hop.identities, *(os.path.expanduser(f"~/.ssh/{name}") for name in PARAMIKO_DEFAULT_KEYS))
    return tuple(key for key in dict.fromkeys(tried) if _encrypted(key))


def _encrypted(key: str) -> bool:
    if not Path(key).is_file():  # paramiko skips a missing default key; a FIFO would block the read
        return False
    for kind in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):  # as paramiko tries them
        try:
            kind.from_private_key_file(key)
            return False
        except paramiko.PasswordRequiredException:
            return True
        except (paramiko.SSHException, OSError, ValueError):  # another kind of key, or no key at all
            continue
    return False


def locked_out(who: str, target: str, hop: sshtarget.Hop, jump: str | None, config: Path) -> MeshrunError:
    """paramiko's last try was a key file it cannot unlock. paramiko tries ~/.ssh/id_* after the agent's
    keys: where the agent holds every such key, it offered them and the host refused them, and that is
    what is said (the old words, with paramiko's own reason)."""
    locked = locked_keys(hop)
    left = unheld(locked, [public_blob(key) for key in locked], agent_keys(hop))
    if locked and not left:
        return login_refused(who, target, hop, jump, config, paramiko.AuthenticationException("Authentication failed."))
    return passphrase_needed(who, target, left, hop, config)


def unheld(keys: Sequence[str], publics: Sequence[bytes | None], held: Collection[bytes]) -> tuple[str, ...]:
    """The `keys` whose public half (`publics`, from each KEY.pub; None: unknown) the agent does not hold."""
    return tuple(key for key, public in zip(keys, publics) if public is None or public not in held)


def public_blob(key: str) -> bytes | None:
    """The public key in `key`.pub (what ssh-keygen writes beside it), as an agent lists it; None without one."""
    path = Path(key + ".pub")
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as public:
            fields = public.read(sshtarget.KEY_MAX).split()
        return base64.b64decode(fields[1], validate=True)
    except (OSError, IndexError, ValueError):
        return None


def agent_keys(hop: sshtarget.Hop) -> frozenset[bytes]:
    """The public keys that the agent paramiko offered for `hop` holds: IdentityAgent's, else $SSH_AUTH_SOCK's."""
    path = "" if hop.agent == sshtarget.AGENT_NONE else hop.agent or os.environ.get("SSH_AUTH_SOCK", "")
    if not path:
        return frozenset()
    try:
        agent = SocketAgent(path)  # no keys where the socket is not there or refuses
    except AgentSilent:  # it answered the connect a moment ago; now nothing it holds can be named
        return frozenset()
    try:
        return frozenset(key.asbytes() for key in agent.get_keys())
    finally:
        agent.close()


def passphrase_needed(who: str, target: str, keys: Sequence[str], hop: sshtarget.Hop, config: Path) -> MeshrunError:
    """One line for the keys paramiko cannot unlock (`keys`, from locked_keys): ssh asks for the
    passphrase, or on macOS reads it from the Keychain (ssh_config's UseKeychain), and so logs in where
    meshrun could not even offer the key. Only an agent holding it lets meshrun (and rsync's ssh) use it."""
    several = len(keys) > 1
    named = (f"the keys {', '.join(keys)} are" if several else f"the key {keys[0]} is" if keys
             else f"the key ({hop.identity_from or '~/.ssh/id_*'}) is")
    files, them = " ".join(shlex.quote(key) for key in keys) or "KEY", "them" if several else "it"
    if hop.agent == sshtarget.AGENT_NONE:
        agent = (f"IdentityAgent none for Host {hop.label} in {config} keeps every SSH agent out; point "
                 f"IdentityAgent at an agent and add {them} there (`ssh-add {files}`)")
    elif hop.agent:
        agent = (f"the agent at IdentityAgent {hop.agent} does not hold {them}; run "
                 f"`SSH_AUTH_SOCK={shlex.quote(hop.agent)} ssh-add {files}`")
    else:
        agent = f"no SSH agent holds {them}; run `ssh-add {files}` (on macOS `ssh-add --apple-use-keychain {files}`)"
    return MeshrunError(f"{who}: SSH login to {target}: {named} passphrase-protected and {agent}; meshrun does "
                        "not read UseKeychain or ask for passphrases")


def unreachable(who: str, target: str, err: Exception, jump: str | None) -> MeshrunError:
    if jump is not None and jumps.refused_early(err):  # tried jumps.REFUSED_TRIES times
        return MeshrunError(f"{who}: {target} closed the SSH connection before its banner, {jumps.REFUSED_TRIES} "
                            "tries; its sshd refuses new connections while too many are logging in (MaxStartups), "
                            "or it is no sshd: try again, or raise MaxStartups in its sshd_config")
    return MeshrunError(f"{who}: cannot connect to {target} ({err}); is sshd running and the port "
                        "open? (fab check-network)")


def unresolved(who: str, err: Unresolved, hop: sshtarget.Hop, jump: str | None, config: Path) -> MeshrunError:
    where = "in the inventory" if jump is None else f"as HostName for Host {hop.label} in {config}"
    return MeshrunError(f"{who}: {err}; check DNS or write an IP address {where}")


def silent(who: str, where: str, seconds: float) -> MeshrunError:
    """A server that accepted the TCP connection and sent nothing: a frozen host, a wedged sshd."""
    return MeshrunError(f"{who}: {where} accepted the connection but its sshd said nothing within {seconds:.0f} s; "
                        "is the host overloaded or frozen?")


def unsendable(host: str, argv: Sequence[str], err: ValueError) -> MeshrunError:
    """A command SSH's strict UTF-8 cannot carry, never an internal error (the net under check/answers.host_path)."""
    return MeshrunError(f"host '{host}': cannot send `{repr(str(argv[0])[:60])[1:-1]}` ({type(err).__name__}): a path "
                        f"it reported is not text a command can carry; fab check-network --hosts {host}")


def open_hop(conn: HopConnection, hop: sshtarget.Hop, jump: str | None, opening: Opening) -> None:
    """Open `conn` (a jump host's, shared: once for all its sessions) or raise a one-line MeshrunError."""
    who, target = hostkeys.whose(opening.host, jump), f"{hop.user}@{hop.hostname}:{hop.port}"
    try:
        if isinstance(conn, JumpConnection):
            conn.open_within(opening.timeout)  # shared: once for all its sessions, a refused try retried
        else:
            conn.open()
    except Unresolved as err:
        raise unresolved(who, err, hop, jump, opening.config) from None
    except AgentSilent as err:  # the local agent, not the host: said before the timeouts that blame the host
        raise MeshrunError(f"{who}: {err}") from None
    except SaidNothing as err:
        raise silent(who, f"{hop.hostname}:{hop.port}", err.seconds) from None
    except hostkeys.UnknownHostKey as err:
        raise hostkeys.unknown_key_error(opening.host, err, opening.known_hosts, jump) from None
    except paramiko.BadHostKeyException as err:
        # paramiko names the host without its port; known_hosts (and `fab trust`) use `[addr]:port`.
        named = paramiko.BadHostKeyException(hostkeys.known_hosts_name(hop.hostname, hop.port), err.key,
                                             err.expected_key)
        raise hostkeys.changed_key_error(opening.host, named, opening.known_hosts, jump) from None
    except paramiko.PasswordRequiredException:  # an AuthenticationException: said before it, as its own case
        raise locked_out(who, target, hop, jump, opening.config) from None
    except paramiko.AuthenticationException as err:
        raise login_refused(who, target, hop, jump, opening.config, err) from None
    except (socket.timeout, TimeoutError):
        raise MeshrunError(f"{who}: no SSH answer from {target} within {opening.timeout:.0f} s; is the host "
                           "up and its address right? (fab check-network)") from None
    except paramiko.SSHException as err:
        if "No authentication methods available" in str(err):
            raise MeshrunError(f"{who}: no SSH key to offer {target}; set `identity: ~/.ssh/<key>` in the "
                               f"inventory or IdentityFile for Host {hop.label} in {opening.config}") from None
        raise unreachable(who, target, err, jump) from None
    except (NoValidConnectionsError, OSError, EOFError) as err:
        raise unreachable(who, target, err, jump) from None
    transport = conn.client.get_transport()
    if transport is not None:  # its socket, or the channel through the hop before it
        transport.sock.settimeout(TRANSPORT_POLL_S)


def reach(before: HopConnection | None, dest: sshtarget.Hop, who: str,
          timeout: float) -> socket.socket | paramiko.Channel:
    """A byte stream to `dest`: a TCP socket (`before` is None), or a direct-tcpip channel through
    the open hop before it."""
    target = f"{dest.hostname}:{dest.port}"
    try:
        if before is None:
            return dial(dest.hostname, dest.port, timeout)
        transport = before.client.get_transport()
        assert transport is not None
        return transport.open_channel("direct-tcpip", (dest.hostname, dest.port), ("", 0), timeout=timeout)
    except Unresolved as err:
        raise MeshrunError(f"{who}: {err}; check DNS or write an IP address in the inventory") from None
    except (socket.timeout, TimeoutError):
        raise MeshrunError(f"{who}: no answer from {target} within {timeout:.0f} s; is the host up "
                           "and its address right?") from None
    except (OSError, paramiko.SSHException) as err:
        raise MeshrunError(f"{who}: cannot connect to {target} ({getattr(err, 'strerror', None) or err}); is sshd "
                           "running and the port open?") from None


def offered_key(sock: socket.socket | paramiko.Channel, who: str, where: str, timeout: float,
                preferred: Sequence[str]) -> paramiko.PKey:
    """The host key the server at the other end of `sock` offers, fetched by a key exchange alone
    (no login). `preferred`: key types to ask for first."""
    transport = paramiko.Transport(sock)
    try:
        options = transport.get_security_options()
        wanted = [k for k in preferred if k in options.key_types]
        options.key_types = [*wanted, *(k for k in options.key_types if k not in wanted)]
        transport.start_client(timeout=timeout)  # returns at its timeout, raising nothing, on a mute server
        if not transport.initial_kex_done:
            if heard_nothing(transport):
                raise silent(who, where, timeout)
            raise MeshrunError(f"{who}: SSH handshake with {where} did not finish within {timeout:.0f} s")
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as err:
        if said_nothing(transport, err):
            raise silent(who, where, timeout) from None
        raise MeshrunError(f"{who}: SSH handshake with {where} failed ({err})") from None
    finally:
        transport.close()
