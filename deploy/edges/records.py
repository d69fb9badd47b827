"""The controller's record of each run: `runs/<run_id>/launch.json`, so later tasks
(`fab status`, `logs`, `stop`, `fetch-checkpoints`, `join`) know where a run lives.

`fab train --resume` reuses the run's folder: its previous attempt's end records are renamed to
`*.prev.json` before the new attempt starts (`retire_attempt`), and the record keeps listing the
hosts of every attempt (`earlier`: those the latest left out).

A record is a file anyone with the folder could have edited or copied, and its fields become hosts to
dial, an inventory to read and argv on hosts: it is read as a regular file of at most 1 MiB and
checked field by field, and one whose `run_id` is not its folder's name is refused (a task naming
the run), or left out with a warning (a task listing runs), never trusted.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from meshrun.fsutil import atomic_write_bytes, atomic_write_json, fsync_dir, read_regular
from meshrun.layout import DEFAULT_PG_TIMEOUT_S, EVENTS, HEARTBEAT_TIMEOUT_S, is_run_id, LAUNCH_RECORD, SUMMARY
from meshrun.deploy.edges.localproc import PROC, command_words, process_exists
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inputfiles import RECORD_MAX, read_optional
from meshrun.deploy.inventory.fields import NAME_RE
from meshrun.deploy.inventory.shown import shown, with_path
from meshrun.deploy.run.answers import from_json, is_int, is_real
from meshrun.deploy.run.hoststate import HostState
from meshrun.deploy.run.outcome import JobStatus
from meshrun.deploy.run.recordcopy import RETIRED
from meshrun.deploy.run.summary import RunSummary

RECORD_FIX = "the run record is damaged or was edited; restore it, or remove the run's folder"
Warn = Callable[[str], None]


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    inventory: str  # the inventory used: relative to the project root when inside it (stored_inventory), else absolute
    hosts: tuple[str, ...]
    started: float
    detached: bool
    rdzv_endpoint: str
    rdzv_id: str = ""
    elastic: tuple[int, int] | None = None  # (min, max) for elastic runs
    workload: dict = field(default_factory=dict)  # plan.Workload fields: script, config, args
    pg_timeout_s: int = DEFAULT_PG_TIMEOUT_S
    controller_pid: int | None = None  # the attached `fab train` that watches this run
    firewall: bool = False  # started with --firewall: a joining host is let in by the members' chains
    # Hosts of an earlier attempt (`fab train --resume`) that the latest one left out. They stay in
    # `hosts`, after this attempt's, so status/stop/fetch still reach their trees; they are no members.
    earlier: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        """The latest attempt's hosts (its launch, and any that joined it since), in the order of
        `hosts`: the order a joiner's succession walks (membership.join_order) and a resume's default."""
        return tuple(h for h in self.hosts if h not in self.earlier)

    def with_member(self, name: str) -> RunRecord:
        """The record once `name` joined: listed, and no longer an earlier attempt's host only."""
        hosts = self.hosts if name in self.hosts else (*self.hosts, name)
        return replace(self, hosts=hosts, earlier=tuple(h for h in self.earlier if h != name))

    def without_member(self, name: str) -> RunRecord:
        """The record once `name`'s join failed: still listed (stop/status reach it), no member (a bare
        `--resume` launches on members only)."""
        if name not in self.hosts or name in self.earlier:
            return self
        return replace(self, earlier=(*self.earlier, name))

    def save(self, runs: Path) -> Path:
        path = runs / self.run_id / LAUNCH_RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, asdict(self))
        return path


def stored_inventory(path: Path, root: Path) -> str:
    """launch.json's `inventory`: relative to the project root when the inventory lies inside it, else
    absolute (as every older record has it). An absolute path pinned the checkout's old place: once it
    was moved, renamed or cloned, every run read `not asked`, and a detached run could not be stopped.
    Read back by agents.inventory_of, against the project root of the command reading it."""
    found = path.resolve()
    try:
        return found.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(found)


def load_record(runs: Path, run_id: str, flag: str = "--run") -> RunRecord:
    """The run's launch record; `flag` is the option that named it, for the message."""
    if not is_run_id(run_id):
        raise InputError(f"{flag} {shown(run_id)}: not a run id (letters, digits, '.', '_', '-'; no '..'); "
                         "list runs with `fab status`")
    path = runs / run_id / LAUNCH_RECORD
    data = read_optional(path, RECORD_MAX, "run record", RECORD_FIX)
    if data is None:
        raise InputError(f"run '{run_id}': no {path}; list runs with `fab status`")
    return record_from(from_json(data.decode("utf-8", "replace")), run_id, path)


def record_from(data: Any, run_id: str, path: Path) -> RunRecord:
    """The record `data` (launch.json's JSON) holds for the folder `run_id`, every field checked."""
    def bad(field_name: str, expected: str) -> InputError:
        return InputError(with_path("", path, f": {field_name} is not {expected}; {RECORD_FIX}"))

    if not isinstance(data, dict):
        raise InputError(with_path("", path, f": not a JSON object; {RECORD_FIX}"))
    if data.get("run_id") != run_id:
        got = data.get("run_id")
        raise InputError(with_path("", path, f": run_id {shown(got)} is not its folder's name {shown(run_id)}; "
                                   f"{RECORD_FIX}"))
    hosts, elastic, work = data.get("hosts"), data.get("elastic"), data.get("workload", {})
    earlier = data.get("earlier", [])
    checks = [
        ("inventory", isinstance(data.get("inventory"), str) and data["inventory"].isprintable(), "a path"),
        ("hosts", isinstance(hosts, list) and hosts != [] and all(isinstance(h, str) and NAME_RE.fullmatch(h)
                                                                 for h in hosts), "a list of host names"),
        ("started", is_real(data.get("started")), "a time"),
        ("detached", isinstance(data.get("detached"), bool), "true or false"),
        ("rdzv_endpoint", isinstance(data.get("rdzv_endpoint"), str) and data["rdzv_endpoint"].isprintable(),
         "host:port"),
        ("rdzv_id", data.get("rdzv_id", "") == "" or isinstance(data["rdzv_id"], str) and is_run_id(data["rdzv_id"]),
         "a rendezvous id"),
        ("elastic", elastic is None or (isinstance(elastic, list) and len(elastic) == 2 and all(map(is_int, elastic))
                                        and 1 <= elastic[0] <= elastic[1]), "null or [MIN, MAX]"),
        ("workload", _workload_ok(work), "the trainer's or a script's workload"),
        ("pg_timeout_s", is_int(data.get("pg_timeout_s", 1)) and data.get("pg_timeout_s", 1) >= 1, "whole seconds"),
        ("controller_pid", data.get("controller_pid") is None or is_int(data["controller_pid"])
         and data["controller_pid"] > 0, "null or a process id"),
        ("firewall", isinstance(data.get("firewall", False), bool), "true or false"),
        ("earlier", _earlier_ok(earlier, hosts), "a list of some of its hosts"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise bad(name, expected)
    return RunRecord(run_id, data["inventory"], tuple(hosts), data["started"], data["detached"],
                     data["rdzv_endpoint"], data.get("rdzv_id", run_id), tuple(elastic) if elastic else None, work,
                     data.get("pg_timeout_s", DEFAULT_PG_TIMEOUT_S), data.get("controller_pid"),
                     data.get("firewall") is True, tuple(earlier))


def _earlier_ok(earlier: object, hosts: object) -> bool:
    """Hosts of the record, not all of them: the latest attempt has at least one."""
    if not isinstance(earlier, list) or not isinstance(hosts, list):
        return False
    return (all(isinstance(h, str) and h in hosts for h in earlier)
            and any(h not in earlier for h in hosts))


def _workload_ok(work: object) -> bool:
    """`{"script": str|null, "config": str|null, "args": [str, ...]}` (plan.Workload's fields)."""
    return (isinstance(work, dict) and all(work.get(k) is None or isinstance(work[k], str) for k in ("script", "config"))
            and isinstance(work.get("args", []), list) and all(isinstance(a, str) for a in work.get("args", [])))


def all_records(runs: Path, warn: Warn | None = None) -> list[RunRecord]:
    """Every recorded run, newest first: by the time its latest attempt started, then by id (an id's
    clock, and a folder copied in by hand, say nothing of when a run started); a damaged record is
    left out (`warn` says which and why)."""
    found = sorted(runs.glob(f"*/{LAUNCH_RECORD}"), reverse=True)
    records = []
    for path in found:
        try:
            records.append(load_record(runs, path.parent.name))
        except InputError as err:
            if warn is not None:
                warn(f"{err}; left out")
    return sorted(records, key=lambda r: (r.started, r.run_id), reverse=True)


def no_runs(runs: Path) -> str:
    return with_path("no runs recorded under ", runs, "; start one with `fab train`")


def resolve_run(runs: Path, run_id: str | None, live_only: bool = False, warn: Warn | None = None) -> RunRecord:
    """The named run, else the newest one by start (with `live_only`, the newest that may still be running:
    a task never contacts the hosts of a finished or stale run unless the user names it)."""
    if run_id:
        return load_record(runs, run_id)
    records = live_records(runs, warn) if live_only else all_records(runs, warn)
    if not records:
        if live_only and all_records(runs):
            raise InputError("no recorded run may still be running; name one with --run ID "
                             "(the newest is " + all_records(runs)[0].run_id + ")")
        raise InputError(no_runs(runs))
    return records[0]


SEVERAL_SHOWN = 8  # runs a refusal names; the rest are counted (`fab status` lists them all)
# The detail of a host state no host was asked for: its run's record names hosts that cannot be
# resolved (agents.run_states). Its own prefix, so "not asked" never reads as the agent's "unknown".
NOT_ASKED = "not asked: "
UNANSWERED = ("unreachable", "stuck")  # states of a host asked that gave no answer


def resolve_live_run(runs: Path, run_id: str | None, command: str, warn: Warn | None = None,
                     ask_hosts: Callable[[list[RunRecord]], list[HostState]] | None = None) -> RunRecord:
    """`fab stop` and `fab logs`: the named run, else the one run that may still be running; of
    several, the one `ask_hosts` finds running. With several running (two terminals, two people
    sharing a checkout), the newest may be someone else's: an InputError names them instead of
    taking one (`resolve_run` with `live_only` takes the newest). With none running, the newest is
    taken as before, and `warn` names the runs no host of which answered: one may be the user's."""
    if run_id:
        return load_record(runs, run_id)
    live = live_records(runs, warn)
    if len(live) > 1 and ask_hosts is not None:
        # A detached run never gets a summary: every one ever started "may" run. Its hosts say.
        states = ask_hosts(live)
        running = [r for r in live if any(s.run_id == r.run_id and s.state == "running" for s in states)]
        if not running and warn is not None and (unknown := not_known(live, states)):
            warn(took_newest(live[0], unknown, command))
        live = running or live[:1]  # none running: the newest, as before (its hosts are told to stop)
    if len(live) > 1:
        raise InputError(several_live(live, command))
    return live[0] if live else resolve_run(runs, None, live_only=True)  # none: its one line


def not_known(records: list[RunRecord], states: list[HostState]) -> list[tuple[RunRecord, str]]:
    """The runs of `records` none of whose hosts answered (not asked, unreachable or stuck), each with
    its first host's why: whether they still run is not known."""
    def silent(s: HostState) -> bool:
        return s.state in UNANSWERED or (s.state == "unknown" and (s.detail or "").startswith(NOT_ASKED))

    found = []
    for record in records:
        mine = [s for s in states if s.run_id == record.run_id]
        if mine and all(map(silent, mine)):
            found.append((record, (mine[0].detail or mine[0].state).removeprefix(NOT_ASKED)))
    return found


def took_newest(newest: RunRecord, unknown: list[tuple[RunRecord, str]], command: str) -> str:
    """One line: no host says a run is running, so `command` takes the newest; which runs may be
    running all the same (each with the what of its why, the part before its advice), and how to name one."""
    shown = ", ".join(f"{r.run_id} ({why.split('; ')[0]})" for r, why in unknown[:SEVERAL_SHOWN])
    more = f" and {len(unknown) - SEVERAL_SHOWN} more (fab status lists them)" if len(unknown) > SEVERAL_SHOWN else ""
    return (f"no host says a run is running, so {command} takes the newest, {newest.run_id}; whether these still "
            f"run is not known: {shown}{more}; name one: {command} --run ID")


def several_live(records: list[RunRecord], command: str) -> str:
    """One line naming the runs that may still be running (newest first) and how to name one."""
    shown = ", ".join(f"{r.run_id} ({','.join(r.members)})" for r in records[:SEVERAL_SHOWN])
    more = f" and {len(records) - SEVERAL_SHOWN} more (fab status lists them)" if len(records) > SEVERAL_SHOWN else ""
    return f"{len(records)} runs may still be running: {shown}{more}; name one: {command} --run ID"


def controller_alive(record: RunRecord, proc: Path = PROC) -> bool:
    """The run's attached controller still runs: its pid's command line is a `fab train` or `meshrun
    train` (`runs_fab_train`), read from /proc, or from `ps` where there is none (macOS). `proc`: where
    /proc is (a test points it at an empty folder to be a Mac)."""
    if record.detached or not record.controller_pid:
        return False
    words = command_words(record.controller_pid, proc)
    if words is None:
        # No /proc and no answer from ps: a process with that pid is taken for the controller. Judged
        # dead, a live run would get a second controller behind its back (a --resume's agents and end
        # reaching its processes, a join started detached beside it); judged alive, a dead one whose pid
        # was reused only makes `fab status/logs/stop` need --run ID, and a resume wait for that pid to go.
        return process_exists(record.controller_pid)
    return runs_fab_train(words)


def runs_fab_train(words: Sequence[str]) -> bool:
    """Pure rule: a command line (its words) is an attached controller's, `[python] .../fab train ...`
    or `meshrun train`: one word holds "fab" or "meshrun", and one holds "train". None of these has
    whitespace, so ps's line split at whitespace is judged as /proc's arguments are."""
    return any("fab" in w or "meshrun" in w for w in words) and any("train" in w for w in words)


ENDED = frozenset(s.value for s in JobStatus)  # the statuses the controller writes in a summary.json


def own_summary(run_path: Path, run_id: str) -> dict | None:
    """The controller's summary.json of `run_id` in `run_path`: a JSON object of that run_id and one of
    meshrun's statuses; else None. A file of that name a script wrote (`{"best_loss": 0.33}`), or one
    that is not a regular file of at most RECORD_MAX, is no end of the run: taken for one, a detached
    run that still runs would drop out of `fab status`, and `fab stop` would pick another run."""
    try:
        data = read_regular(run_path / SUMMARY, RECORD_MAX)
    except OSError:
        return None
    found = from_json(data.decode("utf-8", "replace"))
    if not isinstance(found, dict) or found.get("run_id") != run_id:
        return None
    status = found.get("status")
    return found if isinstance(status, str) and status in ENDED else None  # a list is unhashable: never `in`


def has_own_summary(run_path: Path, run_id: str) -> bool:
    """Does `run_path` hold the controller's summary.json of `run_id` (`own_summary`)?"""
    return own_summary(run_path, run_id) is not None


def may_be_running(record: RunRecord, has_summary: bool, attached_controller_alive: bool, now: float) -> bool:
    """Pure rule: a run with the controller's summary (`has_own_summary`) has ended; an attached run
    whose controller is gone ended too once its agents missed heartbeats for HEARTBEAT_TIMEOUT_S; a
    detached run may run on."""
    if has_summary:
        return False
    if record.detached:
        return True
    return attached_controller_alive or now - record.started < HEARTBEAT_TIMEOUT_S + 5


def live_records(runs: Path, warn: Warn | None = None) -> list[RunRecord]:
    """Recorded runs that may still be running, newest first."""
    now = time.time()
    return [r for r in all_records(runs, warn)
            if may_be_running(r, has_own_summary(runs / r.run_id, r.run_id), controller_alive(r), now)]


def refuse_running(runs: Path, record: RunRecord, ask_hosts: Callable[[], list[HostState]]) -> None:
    """`fab train --resume` of a run that still runs would stop it: a new attempt's agents and its end
    (`stop` by run id on every host) reach the old one's processes. A summary means it ended. An
    attached run runs while its controller does (refused with no host asked); once that is gone its
    agents stop within HEARTBEAT_TIMEOUT_S, and a new one refuses while one holds its host's lock.
    A detached run never gets a summary: `ask_hosts()` asks its hosts, as `fab status --run` does.
    Only the controller's own summary counts (`has_own_summary`): a script's file of that name is no end."""
    if has_own_summary(runs / record.run_id, record.run_id):
        return
    if controller_alive(record):
        why = f"its controller, pid {record.controller_pid} on this machine, still watches it"
    elif not record.detached or not (hosts := [s.host for s in ask_hosts() if s.state == "running"]):
        return
    else:
        why = f"its agents still run on {', '.join(hosts)}"
    raise InputError(f"--resume {record.run_id}: the run is still running ({why}); stop it first with "
                     f"fab stop --run {record.run_id}, or check with fab status --run {record.run_id}")


def new_run_id() -> str:
    """Unique (reusing an rdzv id would join a stale rendezvous), and its time in UTC: local time
    jumps back at a DST change or a flight west. Which run is newest goes by `started` (all_records)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def retired_name(name: str) -> str:
    """`summary.json` -> `summary.prev.json`: where a resume keeps the previous attempt's file."""
    return name.removesuffix(".json") + ".prev.json"


def retire_attempt(run_path: Path) -> tuple[str, ...]:
    """Before a resumed run starts again in its folder: the previous attempt's summary.json,
    provenance.json and commplan.json become *.prev.json (a newer resume replaces them), each by one
    rename, so the run counts as running until its new summary (may_be_running), and neither that
    summary nor `fab report` reads the old outcome, provenance or --comm floors. Returns the names."""
    moved = []
    for name in RETIRED:
        try:
            os.replace(run_path / name, run_path / retired_name(name))
        except FileNotFoundError:
            continue
        moved.append(name)
    if moved:
        fsync_dir(run_path)  # the renames survive a crash before the new attempt writes anything
    return tuple(moved)


def write_summary(run_path: Path, summary: RunSummary) -> Path:
    """`runs/<run_id>/summary.json`, atomically: scripts polling for it never read half of it. A disk
    that refuses it (full: a host's flood of lines can do that) is one line naming the file."""
    path = run_path / SUMMARY
    try:
        run_path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (summary.to_json() + "\n").encode())
    except OSError as err:
        raise MeshrunError(with_path("cannot write ", path, f" ({err.strerror or err}): free space there; run "
                                     f"{summary.run_id} ended {summary.status}, and its hosts keep their files "
                                     f"(fab fetch-checkpoints --run {summary.run_id})")) from None
    return path


def append_event(run_path: Path, event: dict[str, Any]) -> None:
    """One membership event of an attached run as a line of `runs/<run_id>/events.jsonl`, for
    `fab status --watch`; a journal that cannot be written never stops the run."""
    try:
        with open(run_path / EVENTS, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
    except OSError:
        pass
