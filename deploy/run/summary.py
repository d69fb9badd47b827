"""`runs/<run_id>/summary.json`: the user contract scripts read. Keys are only ever added."""

from __future__ import annotations

from datetime import datetime, timezone
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from meshrun.layout import CONTROLLER_SILENT, EXIT_RECORD, METRICS, PROGRESS, RecordKind, STARTS_FILE, host_dir, run_dir
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.run.membership import OUTLIVED_DETAIL, Change, MembershipEvent
from meshrun.deploy.run.plan import LaunchPlan
from meshrun.deploy.run.answers import from_json, is_int, is_real
from meshrun.deploy.run.progress import Progress, parse_progress

COUNTS = ("world_size", "restarts", "epochs_completed")  # result.json's counts (train/metrics.py)
MAX_METRICS = 100  # of a result.json: the trainer writes a handful
STARTS_READ_MAX = 64 << 10  # of a host's starts.json: one short entry per attempt of the run
# Of each file the end's one read per host takes (`end_read`), from its end: metrics.jsonl's last epoch
# records (under 1 KiB each at a few ranks: a thousand epochs); starts.json, exit.json, progress.json are small.
END_READ_MAX = 1 << 20
EXIT_READ_MAX = 4 << 10  # of an agent's exit.json: rc, reason, ended, generation
# The reason an agent writes in exit.json when it stopped its run because this controller went silent
# (deploy/host/agent.py `watch`): a laptop closed, a controller frozen or cut off past HEARTBEAT_TIMEOUT_S.
HEARTBEAT_LOSS = re.compile(re.escape(CONTROLLER_SILENT).replace(r"\{seconds\}", "([0-9]{1,9})"), re.ASCII)
# How far a host's clock may be from this controller's and its records still count as of the run: a host
# without NTP whose hardware clock keeps local time is hours off; a record of another day is no record of it.
CLOCK_SKEW_S = 24 * 3600


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    status: str  # succeeded | failed | stopped
    hosts: list[str]
    world_size: int
    restarts: int  # starts of the worker group after the first (`restarts_of`)
    epochs_completed: int
    metrics: dict[str, float]
    duration_s: float
    started: float
    ended: float
    reason: str | None = None
    failed_host: str | None = None
    best_test_acc: float | None = None
    host_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # membership changes, in order
    lost_hosts: list[str] = field(default_factory=list)
    comm: dict[str, Any] | None = None  # with --comm: hook, floor_s, measured_s, ratio (deploy/edges/comm.py)
    provenance: dict[str, Any] | None = None  # what produced the run (deploy/run/provenance.py)
    idle: list[dict[str, Any]] = field(default_factory=list)  # idle warnings: time, host, idle_s, threshold
    trained_alone: list[dict[str, Any]] = field(default_factory=list)  # --script ranks that never joined: deploy/run/alone.py

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _finite(value: object) -> bool:
    return is_real(value)  # 10**400 too: math.isfinite would raise OverflowError on it


def trainer_result(text: str) -> dict[str, Any] | None:
    """The trainer's result.json as a host gave it: its known fields that have the right type, the
    others left out (their defaults stand); None when it is not a JSON object. The host wrote it, so it
    is data: a wrong shape must not cost the run its summary."""
    raw = from_json(text)
    if not isinstance(raw, dict):
        return None
    found: dict[str, Any] = {k: raw[k] for k in COUNTS if is_int(raw.get(k)) and 0 <= raw[k] < 2**31}
    metrics = raw.get("metrics")
    if isinstance(metrics, dict):
        found["metrics"] = {k[:80]: float(v) for k, v in list(metrics.items())[:MAX_METRICS] if _finite(v)}
    if _finite(raw.get("best_test_acc")):
        found["best_test_acc"] = float(raw["best_test_acc"])
    return found


def ran_world_size(plan: LaunchPlan, outcome: JobOutcome) -> int:
    """Without the trainer's result (a --script run, or one that failed or was stopped): a fixed run's
    is the launch's (it ends at its first change of membership: the sizes after it are its teardown's,
    0 once its one host is lost); an elastic run's, the size after the last change of membership the
    controller saw (docs/elastic.md: the final world size), or, where that left none running, the last
    it ran with. `finished` events count the hosts still running, not the job's size."""
    if plan.elastic is None:
        return plan.world_size
    changes = [e.world_size for e in outcome.events if e.event is not Change.FINISHED]
    return next((size for size in reversed(changes) if size > 0), changes[-1] if changes else plan.world_size)


def starts_key(rdzv_id: str, host: str | None) -> str:
    """A host's key in starts.json for the launch: a --script run's runner (deploy/host/runscript.py) counts
    under `<rdzv id>@<host>`, as hosts sharing a workdir share the file; the trainer's host leaders
    (train/starts.py, `host` None) under the rdzv id alone, as they write the count the group agreed."""
    return rdzv_id if host is None else f"{rdzv_id}@{host}"


def host_starts(text: str, rdzv_id: str, host: str | None) -> int | None:
    """`host`'s count of the launch's worker-group starts, from its starts.json as it answered, under its
    `starts_key` only (another host sharing the workdir counts under its own; `host` None: the trainer's
    key); None unless a whole JSON object (not cut at STARTS_READ_MAX) holds a whole number >= 1 there.
    The host wrote it, so it is data: how large it may be is `restarts_of`'s to judge."""
    if len(text) > STARTS_READ_MAX:
        return None
    raw = from_json(text)
    value = raw.get(starts_key(rdzv_id, host)) if isinstance(raw, dict) else None
    return value if is_int(value) and value >= 1 else None


@dataclass(frozen=True)
class EpochEnd:
    """An epoch record of rank 0's metrics.jsonl (train/metrics.py EpochRecord), as far as the summary needs it."""

    epoch: int  # epochs completed, 1-based
    time: float
    test_acc: float
    test_loss: float | None  # None: not finite (a test set it could not use, a diverged run)


@dataclass(frozen=True)
class HostEnd:
    """What one host's files say after the run, from the end's one read of it (`end_read`). The host
    wrote them, so each is shape-checked: a file missing or out of shape adds nothing."""

    host: str
    starts: int | None = None  # its count of the launch's worker-group starts (`host_starts`)
    silent_s: int | None = None  # its agent stopped the run after this long without this controller's heartbeat
    progress: Progress | None = None  # rank 0's progress.json, where this host has it
    epochs: tuple[EpochEnd, ...] = ()  # rank 0's epoch records, where this host has metrics.jsonl
    epochs_cut: bool = False  # its metrics.jsonl was longer than END_READ_MAX: its first epochs were not read


def end_files(run_id: str, host: str, trainer: bool) -> list[str]:
    """The files the end reads of `host`, relative to its workdir: its starts count and its agent's exit
    record; of a built-in trainer run without result.json, rank 0's progress and metrics too."""
    files = [f"{run_dir(run_id)}/{STARTS_FILE}", f"{host_dir(run_id, host)}/{EXIT_RECORD}"]
    return files + ([f"{run_dir(run_id)}/{PROGRESS}", f"{run_dir(run_id)}/{METRICS}"] if trainer else [])


def end_read(files: Sequence[str]) -> list[str]:
    """One command for all of `files`: the last END_READ_MAX + 1 bytes of each (one past: a file cut is
    told from a whole one), each after tail's `==> FILE <==` line; a file it cannot open has none."""
    return ["tail", "-c", str(END_READ_MAX + 1), "--", *files]


def split_tail(text: str, files: Sequence[str]) -> dict[str, str]:
    """Each file's part of `end_read`'s answer. tail heads each file it read with `==> FILE <==` on a
    line of its own, after an empty line but for the first; they are looked for in the order asked.
    A file's text holding such a line for a later file is its host's word against itself only."""
    starts: list[tuple[str, int, int]] = []
    at = 0
    for name in files:
        header = f"==> {name} <=="
        pos = text.find(header + "\n", at)
        while pos > 0 and text[pos - 1] != "\n":
            pos = text.find(header + "\n", pos + 1)
        if pos >= 0:
            starts.append((name, pos, pos + len(header) + 1))
            at = pos + len(header) + 1
    ends = [pos - 1 for _, pos, _ in starts[1:]] + [len(text)]  # tail's empty line before the next header
    return {name: text[begin:max(begin, end)] for (name, _, begin), end in zip(starts, ends)}


def exit_silence(text: str) -> int | None:
    """The seconds of silence after which the host's agent stopped the run, when its exit.json says so."""
    raw = from_json(text) if len(text) <= EXIT_READ_MAX else None
    reason = raw.get("reason") if isinstance(raw, dict) else None
    found = HEARTBEAT_LOSS.fullmatch(reason) if isinstance(reason, str) else None
    return int(found.group(1)) if found else None


def epoch_ends(text: str, cut: bool) -> tuple[EpochEnd, ...]:
    """The sound epoch records of a metrics.jsonl's end (`cut`: its first line is a part: left out)."""
    found = []
    for line in text.splitlines()[1 if cut else 0:]:
        row = from_json(line) if '"epoch"' in line else None
        if not (isinstance(row, dict) and row.get("kind") == RecordKind.EPOCH.value):
            continue
        epoch, at, acc, loss = row.get("epoch"), row.get("time"), row.get("test_acc"), row.get("test_loss")
        if is_int(epoch) and 0 < epoch < 2**31 and is_real(at) and is_real(acc) and 0 <= acc <= 1:
            found.append(EpochEnd(epoch, float(at), float(acc), float(loss) if is_real(loss) else None))
    return tuple(found)


def host_end(host: str, text: str, files: Sequence[str], rdzv_id: str, script: bool) -> HostEnd:
    """`host`'s answer to `end_read(files)` (`end_files`' order), read."""
    parts = split_tail(text, files)
    starts, ended = (parts.get(name) for name in files[:2])
    progress = parse_progress(from_json(parts[files[2]])) if len(files) > 2 and files[2] in parts else None
    metrics = parts.get(files[3], "") if len(files) > 3 else ""
    cut = len(metrics.encode()) > END_READ_MAX
    return HostEnd(host, host_starts(starts, rdzv_id, host if script else None) if starts is not None else None,
                   exit_silence(ended) if ended is not None else None, progress, epoch_ends(metrics, cut), cut)


@dataclass(frozen=True)
class RecordBounds:
    """Whose rank-0 records the summary reads, and what they may say, by what this controller knows."""

    holders: frozenset[str]  # the hosts that held rank 0 (`rank0_hosts`)
    earliest: float  # the run's first start (`run_began`), less CLOCK_SKEW_S
    latest: float  # its end, by this controller's clock, plus CLOCK_SKEW_S
    epochs: int | None = None  # the epochs it was to train, where the controller knows them (`-- epochs=N`)

    def holds(self, epoch: int, at: float) -> bool:
        return self.earliest <= at <= self.latest and (self.epochs is None or epoch <= self.epochs)


def run_began(run_id: str) -> float | None:
    """When the run first started, from its id (deploy/edges/records.py new_run_id: UTC, to the second):
    a resumed run's metrics.jsonl holds its earlier attempts' epochs, older than this attempt's start."""
    try:
        return datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def rank0_hosts(plan: LaunchPlan, events: Sequence[MembershipEvent]) -> frozenset[str]:
    """The hosts that held rank 0, by torch's own rule (torch 2.14, dynamic_rendezvous
    `_mark_rendezvous_complete`): its c10d rendezvous numbers each round's members in the order of their
    node descriptors, (`--local-addr`, torchrun's pid, id), so node rank 0, and global rank 0 with it, is on
    the member with the least address string; of hosts sharing it the pid decides, unknown here: each counts.
    A fixed run has one round, its launch (its first change ends it); an elastic run, one more after each
    change that left at least its minimum running before training finished, and every round's holder counts
    as rank 0 moves (h1, the least, lost: on to h2, whose metrics.jsonl starts there). A host that joined is
    not in the plan (never read, `read_ends`): the least of the others counts."""
    address = {h.host.name: h.torchrun[h.torchrun.index("--local-addr") + 1] if "--local-addr" in h.torchrun[:-1]
               else h.host.address for h in plan.hosts}
    minimum = plan.elastic.min if plan.elastic is not None else len(plan.hosts)
    holders: set[str] = set()
    running: set[str] = set()
    for i, e in enumerate(events):
        if e.event is Change.FINISHED or (plan.elastic is None and e.event is not Change.STARTED):
            break  # training is over, or a fixed run's first change ended it: no round after it
        if e.event in (Change.STARTED, Change.JOINED):
            running.add(e.host)
        elif e.event in (Change.LOST, Change.LEFT):
            running.discard(e.host)
        launching = e.event is Change.STARTED and i + 1 < len(events) and events[i + 1].event is Change.STARTED
        if not launching and len(running) >= minimum:  # the launch's hosts meet in one round
            known = [n for n in running if n in address]
            least = min((address[n] for n in known), default=None)
            holders |= {n for n in known if address[n] == least}
    return frozenset(holders)


def trained(ends: Iterable[HostEnd], bounds: RecordBounds) -> dict[str, Any]:
    """Without result.json (a failed or stopped run): result.json's epochs_completed, metrics and
    best_test_acc as rank 0 recorded them, read from the hosts that held rank 0 (`bounds.holders`)
    only: any other member's files are not rank 0's, and a compromised one could serve any epoch and
    accuracy there. Of those, only records within `bounds`. Epochs done: the most progress.json or an
    epoch record says; metrics: the last epoch's; the best: of every epoch's record written last (a
    resume that redid an epoch rewrote it, as `fab report` reads them), none when a host's file was
    longer than was read."""
    ends = [e for e in ends if e.host in bounds.holders]
    latest: dict[int, EpochEnd] = {}
    for record in sorted((r for e in ends for r in e.epochs if bounds.holds(r.epoch, r.time)), key=lambda r: r.time):
        latest[record.epoch] = record
    done = [e.progress.epoch for e in ends if e.progress is not None
            and bounds.holds(e.progress.epoch, e.progress.time)] + list(latest)
    found: dict[str, Any] = {"epochs_completed": max(done)} if done else {}
    if latest:
        last = latest[max(latest)]
        found["metrics"] = {"test_acc": last.test_acc, **({"test_loss": last.test_loss}
                                                          if last.test_loss is not None else {})}
        if not any(e.epochs_cut for e in ends):
            found["best_test_acc"] = max(r.test_acc for r in latest.values())
    return found


def silence_claims(ends: Iterable[HostEnd]) -> dict[str, int]:
    """The hosts whose agents say they stopped the run for this controller's silence, and after how long."""
    return {e.host: e.silent_s for e in ends if e.silent_s is not None}


def silenced(outcome: JobOutcome, ends: Iterable[HostEnd]) -> tuple[int, frozenset[str]] | None:
    """A failed run that this controller's silence ended: the longest silence its agents saw, and the
    hosts whose agents stopped for it. The controller, once awake, finds every agent gone with status
    143 and takes them for lost; their exit.json says they stopped the run themselves. Counted only
    where it explains the failure: the host the controller blamed says so itself. Another host's word
    alone (a compromised member, or an honest one cut off alone) must not turn a host's crash into
    this controller's silence and clear its blame: it stays in that host's timeline detail."""
    silent = silence_claims(ends)
    if outcome.status is not JobStatus.FAILED or outcome.failed_host not in silent:
        return None
    return max(silent.values()), frozenset(silent)


def silence_reason(run_id: str, silent_s: int) -> str:
    return (f"this controller was silent (suspended or cut off): after {silent_s} s with no heartbeat from it "
            f"the agents stopped the run; resume it: fab train --resume {run_id}")


def max_restarts(plan: LaunchPlan) -> int:
    """torchrun's `--max-restarts` as the plan starts it (its first one: a script's own arguments follow)."""
    found = [argv[argv.index("--max-restarts") + 1] for argv in (h.torchrun for h in plan.hosts)
             if "--max-restarts" in argv[:-1]]
    return max((int(n) for n in found if n.isascii() and n.isdigit()), default=0)


def starts_cap(plan: LaunchPlan, events: tuple[MembershipEvent, ...]) -> int:
    """The most starts the timeline allows the worker group: the first; one per change of membership in
    an elastic run (a fixed run's first change ends it); and every torchrun's own budget of failure
    restarts, `--max-restarts` each: each host's torchrun has its own, and a host that joins, or comes
    back, and every succession generation start fresh ones. A bound, not a count: generous, so an
    honest count is never past it, and what a lying host can add is bounded by the run itself."""
    changes = [e for e in events if e.event in (Change.JOINED, Change.LEFT, Change.LOST, Change.SUCCESSION)]
    torchruns = sum(e.event in (Change.STARTED, Change.JOINED) for e in events)
    torchruns = max(torchruns, len(plan.hosts)) * (1 + sum(e.event is Change.SUCCESSION for e in events))
    return 1 + (len(changes) if plan.elastic is not None else 0) + torchruns * max_restarts(plan)


def seen_restarts(plan: LaunchPlan, events: tuple[MembershipEvent, ...]) -> int:
    """The restarts the controller's timeline shows, when no host told its count: in an elastic run,
    each host admitted while training went on (joined, and not stopped as outlived) and each host lost
    or gone while at least MIN kept running and training was not over. An estimate: changes too close
    together restart the group once, and torchrun's restarts of failed workers are not in the timeline."""
    if plan.elastic is None:
        return 0
    outlived = {e.host for e in events if e.event is Change.FINISHED and e.detail == OUTLIVED_DETAIL}
    running: set[str] = set()
    over, count = False, 0
    for e in events:
        if e.event is Change.FINISHED:
            over = True
            running.discard(e.host)
        elif e.event in (Change.STARTED, Change.JOINED):
            count += e.event is Change.JOINED and bool(running) and not over and e.host not in outlived
            running.add(e.host)
        elif e.event in (Change.LOST, Change.LEFT) and e.host in running:
            running.discard(e.host)
            count += not over and len(running) >= plan.elastic.min
    return count


def restarts_of(plan: LaunchPlan, outcome: JobOutcome, result: Mapping[str, Any], starts: Iterable[int]) -> int:
    """summary.json's `restarts`: the trainer's own count (result.json, agreed across its ranks); else
    the hosts' start counts (`starts`, of the hosts that answered): the largest, as a host that joined
    late saw fewer starts; exact when a host that ran from the launch to the end answered, fewer
    otherwise. A compromised host may say anything of its own count: one past `starts_cap` is no
    honest count and is left out; only when every count is past it does the cap stand for them.
    Without any count, what the timeline shows (`seen_restarts`), never a bare 0."""
    if "restarts" in result:
        return int(result["restarts"])
    counts = [n for n in starts if is_int(n) and n >= 1]
    if not counts:
        return seen_restarts(plan, outcome.events)
    cap = starts_cap(plan, outcome.events)
    return max((n for n in counts if n <= cap), default=cap) - 1


def record_bounds(plan: LaunchPlan, outcome: JobOutcome, epochs: int | None) -> RecordBounds:
    began = run_began(plan.run_id)
    return RecordBounds(rank0_hosts(plan, outcome.events), (outcome.started if began is None else began) - CLOCK_SKEW_S,
                        outcome.ended + CLOCK_SKEW_S, epochs)


def timeline_of(events: Iterable[MembershipEvent], claims: Mapping[str, int], counted: bool) -> list[dict[str, Any]]:
    """The membership changes; beside each loss of a host whose agent says it stopped for this
    controller's silence, its word: as what ended the run where `silenced` counts it, else as a claim."""
    said = ("its agent stopped the run: no heartbeat from this controller for {} s" if counted
            else "its agent says it had no heartbeat from this controller for {} s")
    return [{"time": round(e.time, 3), "event": e.event.value, "host": e.host, "world_size": e.world_size,
             "detail": "; ".join(filter(None, [e.detail, said.format(claims[e.host])]))
             if e.host in claims and e.event is Change.LOST else e.detail} for e in events]


def build_summary(plan: LaunchPlan, outcome: JobOutcome, result: Mapping[str, Any] | None,
                  comm: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None,
                  starts: Iterable[int] = (), ends: Sequence[HostEnd] = (), epochs: int | None = None) -> RunSummary:
    """Combine what the controller saw with what the trainer reported (result.json), if any, and what
    the hosts' files said after the run (`ends`; `starts`: counts given apart): the worker group's
    starts, what rank 0 recorded of a run that wrote no result.json (it failed or was stopped; `epochs`:
    those it was to train, where known), and whether the agents stopped the run because this controller
    was silent (`silenced`: a stopped run, no host's fault, none of them lost)."""
    result = {**trained(ends, record_bounds(plan, outcome, epochs)), **(result or {})}  # result.json's own word wins
    silence = silenced(outcome, ends)
    stopped_by = silence[1] if silence else frozenset()
    return RunSummary(
        run_id=plan.run_id,
        status="stopped" if silence else outcome.status.value,
        hosts=[h.host.name for h in plan.hosts],
        world_size=int(result.get("world_size", ran_world_size(plan, outcome))),
        restarts=restarts_of(plan, outcome, result, [*starts, *(e.starts for e in ends if e.starts is not None)]),
        epochs_completed=int(result.get("epochs_completed", 0)),
        metrics={k: float(v) for k, v in dict(result.get("metrics", {})).items()},
        duration_s=round(outcome.duration_s, 2),
        started=outcome.started,
        ended=outcome.ended,
        reason=silence_reason(plan.run_id, silence[0]) if silence else outcome.reason,
        failed_host=None if silence else outcome.failed_host,
        best_test_acc=result.get("best_test_acc"),
        host_results={h.host: {"rc": h.rc, "log": str(h.log), "remaining_pids": list(h.remaining),
                               "stop_error": h.stop_error} for h in outcome.hosts},
        timeline=timeline_of(outcome.events, silence_claims(ends), silence is not None),
        lost_hosts=sorted({e.host for e in outcome.events if e.event is Change.LOST} - stopped_by),
        comm=comm,
        provenance=provenance,
    )
