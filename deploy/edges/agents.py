"""Talking to a run's host agents: starting one (streamed, or detached), what each says about the
run (`status`), and stopping it (`stop`). An unreachable host is a state, not an error."""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from meshrun.layout import STOP_GRACE_S
from meshrun.deploy.edges import sshtarget
from meshrun.deploy.edges.fanout import HostResults, on_each
from meshrun.deploy.edges.records import NOT_ASKED, RunRecord
from meshrun.deploy.inventory.shown import listing, with_path
from meshrun.deploy.edges.sessions import close_all
from meshrun.deploy.edges.sshexec import NotFinished
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S, CommandResult, Session, Stream, connect
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Inventory
from meshrun.deploy.run.answers import StopAnswer, remaining_pids, said
from meshrun.deploy.run.hoststate import HostState, parse_status, parse_statuses
from meshrun.deploy.run.plan import HostLaunch, agent_verb_argv, env_block
from meshrun.deploy.edges.stdinfeed import run_fed

T = TypeVar("T")
# A host's whole connect, every ProxyJump hop of it (each has its own connect timeout): as long as
# sessions.connect_all waits for its hosts.
CONNECT_BUDGET_S = 3 * DEFAULT_CONNECT_TIMEOUT_S


Resolved = tuple[tuple[Host, ...], Inventory, dict[str, MeshrunError]]  # run_hosts' answer


# This command's --inventory (status, logs, stop, fetch-checkpoints, join, leave): reach the runs' hosts
# through it instead of through each record's own (a checkout moved, or a run folder copied, from where
# the record's inventory was). Set by the task around its command (`inventory_given`), read only by
# load_run_inventory: one value per command line, held here rather than passed through six commands,
# the live view and every fan-out to reach that one reader.
_GIVEN: dict[str, Path] = {}


@contextlib.contextmanager
def inventory_given(path: str | None) -> Iterator[None]:
    """Within the block, every run's hosts are reached through the inventory `path` (None: each run's own)."""
    before = _GIVEN.pop("inventory", None)
    if path:
        _GIVEN["inventory"] = Path(path)
    try:
        yield
    finally:
        _GIVEN.pop("inventory", None)
        if before is not None:
            _GIVEN["inventory"] = before


def given_inventory() -> Path | None:
    """This command's --inventory (`inventory_given`), None when not given."""
    return _GIVEN.get("inventory")


def inventory_of(record: RunRecord, root: Path) -> Path:
    """Where the run's recorded inventory is from here: a relative record's (records.stored_inventory)
    under the current project root, so a moved or cloned checkout finds its own; an absolute one as is."""
    path = Path(record.inventory)
    return path if path.is_absolute() else root / path


def recorded_inventory(record: RunRecord, root: Path) -> Path:
    """inventory_of, and one line naming the run and the way out when that file is gone: the inventory
    reader's own "not found" advised `--inventory`/MESHRUN_INVENTORY, which these tasks did not read."""
    path = inventory_of(record, root)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(with_path(f"run {record.run_id} was started with inventory ", path,
                                   ", which is gone; put it back or pass --inventory NEW")) from None
    except OSError:
        pass  # there but unreadable: load_inventory says why
    return path


def load_run_inventory(record: RunRecord, root: Path) -> Inventory:
    """The inventory a task reaches the run's hosts through: this command's --inventory if given, else
    the run's own (recorded_inventory). A --inventory that names none of the run's hosts is another
    cluster's (or a typo's): refused in one line, not shown as every host removed from it."""
    given = _GIVEN.get("inventory")
    if given is None:
        return load_inventory(recorded_inventory(record, root), root)
    inventory = load_inventory(given, root)
    if not set(record.hosts) & set(inventory.host_names):
        raise InputError(with_path("--inventory ", given, f": names none of run {record.run_id}'s hosts "
                                   f"({listing(record.hosts)}); pass the inventory that names them"))
    return inventory


def members_gone(record: RunRecord, known: tuple[str, ...], inventory: Path) -> str | None:
    """A bare `fab train --resume`'s line when `inventory` (its hosts `known`) lacks hosts of the run's
    latest attempt, else None: the hosts default to the record's, so `--hosts: unknown host` named a
    flag the user never typed, and no way out."""
    gone = [name for name in record.members if name not in known]
    if not gone:
        return None
    return with_path(f"run {record.run_id} ran on {listing(gone)}, which ", inventory,
                     " no longer has; name the hosts to resume on with --hosts")


def run_hosts(record: RunRecord, root: Path) -> Resolved:
    """The run's hosts as its inventory now describes them, and {name: why} for those it no longer
    names: such a host cannot be reached, but it must not keep `fab stop` (or status, logs, fetch)
    from the others; each caller reports it as that host's failure."""
    inventory = load_run_inventory(record, root)
    known = {h.name: h for h in inventory.hosts}
    missing = {name: MeshrunError(with_path(f"host '{name}' of run {record.run_id} is no longer in ", inventory.path,
                                            "; put it back in that inventory to reach it"))
               for name in record.hosts if name not in known}
    hosts = tuple(known[h] for h in record.hosts if h in known)
    sshtarget.check_all(hosts)  # a bad ssh_config value is one line before any host is contacted
    return hosts, inventory, missing


def with_missing(results: HostResults[T], missing: dict[str, MeshrunError], order: tuple[str, ...]) -> HostResults[T]:
    """`results` and the `missing` hosts' errors in one, in the run record's host order."""
    merged: HostResults[T] = HostResults()
    for name in order:
        if name in results or name in missing:
            merged[name] = results[name] if name in results else missing[name]
    return merged


def on_each_connected(hosts: tuple[Host, ...], inventory: Inventory, root: Path, fn: Callable[[Host, Session], T],
                      timeout: float, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> HostResults[T]:
    """fn(host, session) on every host at once, each over a session of its own that its task opens
    and closes: a host that cannot be reached is its own entry in the results and the others go on
    (connecting to all first, as sessions_to does, fails every host for one: a dead host kept
    `fab stop` from stopping any). `timeout` bounds a host's whole task, its connect included."""
    def one(host: Host) -> T:
        session = connect(host, inventory.known_hosts, root, connect_timeout)
        try:
            return fn(host, session)
        finally:
            close_all({host.name: session})  # bounded: a cut link's close must not hold the fan-out

    return on_each(hosts, one, timeout=timeout)


def host_states(record: RunRecord, root: Path, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[HostState]:
    """Every host's view of the run; an unreachable host is a state, not an error. A record whose
    hosts cannot be resolved (its inventory gone or broken) is: its callers (`--resume`, join,
    leave) decide from the answer whether the run still runs, and must not read "not asked" as "not running"."""
    return run_states([record], root, timeout, strict=True)


@dataclass(frozen=True)
class Endpoint:
    """A host as one inventory describes it: runs recorded with the same inventory share it, so it
    is connected to and asked once for all of them."""

    host: Host
    known_hosts: Path | None


def run_states(records: list[RunRecord], root: Path, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
               strict: bool = False) -> list[HostState]:
    """Every host's view of every run in `records`, in record then host order. Each distinct host is
    connected to once and asked once, about all its runs (the agent's `status` with no run id), all
    hosts at once: a dead host costs one connect timeout, not one per recorded run that names it.
    A record whose hosts cannot be resolved (its inventory renamed, deleted or broken; a bad ssh_config
    value for one of them) gives each of its hosts `unknown`, NOT_ASKED and why, and is asked nothing:
    one old detached run must not keep `fab stop`, `logs` or `status` from every other run. With
    `strict`, that is raised instead."""
    looked: list[tuple[RunRecord, Resolved | MeshrunError]] = []
    for record in records:
        try:
            looked.append((record, run_hosts(record, root)))
        except MeshrunError as err:
            if strict:
                raise
            looked.append((record, err))
    asked: dict[Endpoint, list[str]] = {}
    for record, found in looked:
        if not isinstance(found, MeshrunError):
            for host in found[0]:
                asked.setdefault(Endpoint(host, found[1].known_hosts), []).append(record.run_id)
    answers = _ask_status({e: tuple(ids) for e, ids in asked.items()}, root, timeout)
    states: list[HostState] = []
    for record, found in looked:
        if isinstance(found, MeshrunError):
            why = NOT_ASKED + " ".join(str(found).splitlines())  # one line in a status row
            states += [HostState(record.run_id, name, "unknown", detail=why) for name in record.hosts]
            continue
        hosts, inventory, missing = found
        mine = HostResults({h.name: answers[Endpoint(h, inventory.known_hosts)][record.run_id] for h in hosts})
        states += [r if isinstance(r, HostState) else HostState(record.run_id, name, _unanswered(r), detail=str(r))
                   for name, r in with_missing(mine, missing, record.hosts).items()]
    return states


def _unanswered(err: MeshrunError) -> str:
    """A host whose sshd answers but whose command did not finish (overloaded, a hung disk) is not
    `unreachable`: the user would look at the network instead of the host."""
    return "stuck" if isinstance(err, NotFinished) else "unreachable"


def _ask_status(asked: dict[Endpoint, tuple[str, ...]], root: Path,
                timeout: float) -> dict[Endpoint, dict[str, HostState | MeshrunError]]:
    """{endpoint: {run id: its state there, or why the host could not be asked}}. A host asked about
    one run is asked about it alone (as ever); about more, once for all its runs. One fan-out, unless
    inventories give one name to different hosts: the fan-out keys its results by name."""
    found: dict[Endpoint, dict[str, HostState | MeshrunError]] = {}
    for wave in _distinct_names(list(asked)):
        by_name = {e.host.name: e for e in wave}
        results = on_each([e.host for e in wave], functools.partial(_ask_one, by_name, asked, root, timeout),
                          timeout=timeout + 20)
        for name, result in results.items():
            endpoint = by_name[name]
            found[endpoint] = (dict.fromkeys(asked[endpoint], result) if isinstance(result, MeshrunError)
                               else result)
    return found


def _ask_one(by_name: dict[str, Endpoint], asked: dict[Endpoint, tuple[str, ...]], root: Path, timeout: float,
             host: Host) -> dict[str, HostState]:
    """One host's states of the runs asked about there, over a session of its own (see on_each_connected)."""
    endpoint = by_name[host.name]
    run_ids = asked[endpoint]
    session = connect(host, endpoint.known_hosts, root, timeout)
    try:
        only = run_ids[0] if len(run_ids) == 1 else None
        result = session.run(agent_verb_argv(host, "status", only, sys.executable), timeout=timeout)
    finally:
        close_all({host.name: session})  # bounded: a cut link's close must not hold the fan-out
    if not result.ok:
        detail = result.stderr.strip()[-200:] or None
        return {run_id: HostState(run_id, host.name, "unknown", detail=detail) for run_id in run_ids}
    if only is not None:
        return {only: parse_status(only, host.name, result.stdout)}
    return parse_statuses(run_ids, host.name, result.stdout)


def _distinct_names(endpoints: list[Endpoint]) -> list[list[Endpoint]]:
    """`endpoints` in waves in which no host name comes twice, in order: one wave unless two
    inventories give one name to different hosts."""
    waves: list[list[Endpoint]] = []
    for endpoint in endpoints:
        wave = next((w for w in waves if all(e.host.name != endpoint.host.name for e in w)), None)
        if wave is None:
            waves.append(wave := [])
        wave.append(endpoint)
    return waves


def stop_run(record: RunRecord, root: Path) -> HostResults[tuple[int, ...]]:
    """Stop the run on every host; {host: pids still alive (should be empty) or the error}."""
    return stop_hosts(record, root, record.hosts)


def stop_hosts(record: RunRecord, root: Path, names: tuple[str, ...]) -> HostResults[tuple[int, ...]]:
    """Stop the run on the named hosts of the run: `stop_answers`' pids still alive, or the error."""
    answers = stop_answers(record, root, names)
    return HostResults((name, a if isinstance(a, MeshrunError) else a.pids) for name, a in answers.items())


def stop_answers(record: RunRecord, root: Path, names: tuple[str, ...]) -> HostResults[StopAnswer]:
    """Stop the run on the named hosts of the run: each agent's answer, with whether the run was
    running there (`fab stop` says where it had already ended). One that cannot be reached is its
    entry in `.failed`, and the others are stopped all the same."""
    hosts, inventory, missing = run_hosts(record, root)
    hosts = tuple(h for h in hosts if h.name in names)
    missing = {name: err for name, err in missing.items() if name in names}

    def stop(host: Host, session: Session) -> StopAnswer:
        result = session.run(agent_verb_argv(host, "stop", record.run_id, sys.executable, STOP_GRACE_S),
                             timeout=STOP_GRACE_S + 25)
        try:
            answer = result.last_json()
        except (ValueError, IndexError):  # the host's answer is data: any shape
            why = said(result.stderr.strip()[-200:])
            raise MeshrunError(f"host '{host.name}': stop gave no report: {why}") from None
        return remaining_pids(host.name, answer)

    results = on_each_connected(hosts, inventory, root, stop, timeout=CONNECT_BUDGET_S + STOP_GRACE_S + 40)
    return with_missing(results, missing, names)


def start_agent(session: Session, launch: HostLaunch) -> Stream:
    """Start a host's agent and hand it the inventory's `env` on stdin (never on its argv)."""
    stream = session.start(launch.agent)
    stream.send(env_block(launch.host))
    return stream


def run_detached_agent(session: Session, launch: HostLaunch, timeout: float = 30,
                       block: bytes | None = None) -> CommandResult:
    """A detached start: the agent reads its env line (`block`, else the host's env block), starts its
    copy, prints the pidfile and exits."""
    return run_fed(session, launch.agent, block or env_block(launch.host), timeout)


def detached_answer(result: CommandResult) -> object:
    """What a detached start answered (its last JSON line: the pidfile, or {"error", "busy"?}), for
    answers.detached_record; an agent that printed none is its stderr's tail as the error."""
    try:
        return result.last_json()
    except (ValueError, IndexError):
        return {"error": result.stderr.strip()[-300:] or f"exit status {result.rc}"}
