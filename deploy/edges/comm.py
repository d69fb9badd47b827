"""`fab train --comm HOOK|auto`: measure the links, size the gradients, compute the floors,
pick the hook (auto) and record the plan; afterwards, the measured all-reduce beside the floor.

Edges: the trainer's `python -m meshrun.train --describe` runs locally (argv, no shell), and its
answer is shape-checked; the bandwidth comes from check-network's link probe over the open sessions.
The math is deploy/run/commplan.py. The config's `sync_bn: true` refuses an explicit flat DiLoCo hook
in one line (`check_comm`) and keeps `auto` from choosing one, as the trainer would refuse it on
every rank. With a measured link, the trainer's `dist.timeout` is held against the chosen hook's
largest collective (`timeout_advice`): raised by a `dist.timeout=` override, at most AUTO_RAISE_MAX_S
(past it a WARN names the value to type), or, when the user set it, a WARN naming the value to set.
Each line names the measured links that set the floor (`floor_links`): each host reports its own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from meshrun.fsutil import atomic_write_bytes
from meshrun.layout import COMM_PLAN, DEFAULT_PG_TIMEOUT_S, TRAINER_MODULE
from meshrun.deploy.check.sites import undeclared_places
from meshrun.deploy.run import commplan
from meshrun.deploy.run.commplan import GRAD_BYTES, Collective, CommPlan, Hook, HookSettings, TimeoutAdvice
from meshrun.deploy.edges.commmetrics import comm_record_argv, last_comm_record
from meshrun.deploy.edges.sessions import first_found
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.edges.check_probes import gather_facts, probe_pairs
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.inputfiles import RECORD_MAX, read_optional
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.run.answers import from_json, is_int, is_real
from meshrun.deploy.run.flags import MAX_PG_TIMEOUT_S
from meshrun.deploy.run.plan import LaunchPlan, Workload
from meshrun.deploy.run.workload import AUTO_RAISE_MAX_S, COMM_OVERRIDE, TIMEOUT_OVERRIDE
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.edges.transport import Session, last_json_line

AUTO = "auto"
BANDWIDTH_S = 2.0  # per link; the probe reports the steady rate of its second half (slow start excluded)
# dist.timeout is at least this many times the largest collective's floor: the floor is the probe's
# steady rate, and a saturated uplink's queue, loss or a slower hour of the link stretch it.
TIMEOUT_SAFETY = 3


@dataclasses.dataclass(frozen=True)
class Gradients:
    shapes: tuple[tuple[int, ...], ...]
    settings: HookSettings


def parse_comm(value: str, workload: Workload) -> str:
    """`--comm` must name a hook or `auto`, and only the built-in trainer has hooks."""
    choices = [AUTO, *(h.value for h in Hook)]
    if value not in choices:
        raise InputError(f"--comm '{value}': expected one of {', '.join(choices)}")
    if workload.script:
        raise InputError("--comm applies to the built-in trainer, not to --script; set the hook in your script")
    return value


def no_torch(python: str) -> str:
    """The line for a controller without torch: meshrun's pyproject leaves torch out on Intel Macs
    (PyTorch has no torch>=2.4 wheel for them), and nothing else the controller does needs it."""
    return (f"--comm needs torch in this Python ({python}) to size the model's gradients: `python -m meshrun.train "
            f"--describe` builds the model here; install it ({shlex.quote(python)} -m pip install 'torch>=2.4'; "
            "PyTorch has no such wheel for Intel Macs), or train without --comm and name the hook after --, e.g. "
            "`-- comm.hook=powersgd`")


def describe(workload: Workload, root: Path) -> Gradients:
    """Gradient shapes, hook settings and sync_bn of the configured model: `python -m meshrun.train
    --describe` here on the controller (no training, no process group). Every `--comm`, a named
    hook's too, needs it: the floors come from the gradients' size. The trainer runs in this very
    Python (sys.executable), so torch is looked for here, without importing it."""
    if importlib.util.find_spec("torch") is None:
        raise MeshrunError(no_torch(sys.executable))
    argv = [sys.executable, "-m", TRAINER_MODULE, "--describe"]
    argv += ["--config", workload.config] if workload.config else []
    done = subprocess.run([*argv, *workload.args], cwd=root, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise MeshrunError(f"--comm: could not size the model's gradients with `python -m meshrun.train --describe`: "
                           f"{reason}; try it locally: {' '.join(argv)}")
    try:
        gradients = described(last_json_line(done.stdout))
    except ValueError:  # no output, or its last line is not JSON
        gradients = None
    if gradients is None:
        raise MeshrunError(f"--comm: `python -m meshrun.train --describe` answered no JSON of the shape this "
                           f"controller reads (is its meshrun this one?); try it locally: {' '.join(argv)}")
    return gradients


def described(info: object) -> Gradients | None:
    """The `--describe` answer (train/__main__.describe), every field this controller reads checked:
    a missing `sync_bn` would let `auto` choose a hook the trainer then refuses on every rank."""
    if not isinstance(info, dict):
        return None
    comm, shapes, sync_bn = info.get("comm"), info.get("shapes"), info.get("sync_bn")
    if not (isinstance(comm, dict) and isinstance(shapes, list) and isinstance(sync_bn, bool)):
        return None
    if not all(isinstance(s, list) and all(is_int(d) and d >= 0 for d in s) for s in shapes):
        return None
    counts = [comm.get(k) for k in ("powersgd_rank", "localsgd_period", "diloco_inner_steps")]
    dtype = comm.get("diloco_wire_dtype")  # a list here would be unhashable: a text, or no answer
    wire = {"fp32": GRAD_BYTES, "bf16": GRAD_BYTES // 2}.get(dtype) if isinstance(dtype, str) else None
    if wire is None or not all(is_int(c) and c >= 1 for c in counts):
        return None
    return Gradients(tuple(tuple(s) for s in shapes),
                     HookSettings(*counts, diloco_wire_bytes=wire, sync_bn=sync_bn))


def check_comm(comm: str, workload: Workload, root: Path) -> Gradients:
    """The model described, and an explicit `--comm` hook refused in one line when the trainer would
    refuse it on every rank: flat DiLoCo with `sync_bn: true` (train/config_rules.check_combinations
    sees `comm.hook=` only once `choose` adds it, after the controller's `--check`). The user's own
    `comm.hook=` override after `--` wins over `--comm`, as on the hosts."""
    gradients = describe(workload, root)
    hook = applied_hook(dataclasses.replace(workload, args=(f"comm.hook={comm}", *workload.args)))
    refused = {h.value for h in commplan.NO_SYNC_BN}
    if comm != AUTO and gradients.settings.sync_bn and hook in refused:
        raise InputError(f"--comm {comm} and sync_bn true (the trainer's config with its overrides) do not go "
                         "together: SyncBatchNorm would communicate at every inner step; pass sync_bn=false after "
                         "-- (the outer step averages BatchNorm statistics) or use --comm hier (SyncBatchNorm "
                         "inside each site)")
    return gradients


Matrix = tuple[tuple[str, str, float | None, float | None], ...]  # (source, target, Mbit/s, RTT ms)


def measure_links(selection: Selection, sessions: Mapping[str, Session]) -> tuple[float | None, float, Matrix]:
    """(bytes/s per node, round trip in seconds, the pairwise matrix) from the check-network link
    probe; bandwidth None when there is nothing to measure (one host). The RTT is the TCP
    handshake of the slowest link."""
    hosts, head = selection.hosts, selection.head
    facts = gather_facts(hosts, head, sessions, {}, sys.executable)
    _, links = probe_pairs(hosts, head, selection.rendezvous.port, sessions, facts, BANDWIDTH_S, sys.executable)
    peers = [link for link in links if not link.rendezvous]
    return (commplan.node_bandwidth((link.source, link.mbit_s) for link in peers),
            commplan.link_rtt(link.connect_ms for link in peers),
            tuple((link.source, link.target, link.mbit_s, link.connect_ms) for link in peers))


def site_map(selection: Selection) -> dict[str, str]:
    """Each host's site; a host without one is a place of its own, as the trainer counts it
    (train/sites.py)."""
    return {h.name: h.site or f"host:{h.name}" for h in selection.hosts}


def choose(comm: str, selection: Selection, sessions: Mapping[str, Session], workload: Workload, root: Path,
           renderer: Renderer, gradients: Gradients | None = None, timeout_s: int | None = None,
           timeout_given: bool = False) -> tuple[Workload, CommPlan | None]:
    """The workload with `comm.hook=...` (and a raised `dist.timeout=`) first among its overrides
    (the user's own overrides after it still win), and the plan behind it (None when no link could
    be measured). `gradients`: what `check_comm` answered earlier; else it runs here, before the
    links are measured but after the pre-flight and the code sync have reached the hosts.
    `timeout_s`: the run's --timeout (the default, or a resumed run's), `timeout_given`: typed; a
    caller that does not say is taken as the default typed (advised, never raised over)."""
    if gradients is None:
        gradients = check_comm(comm, workload, root)
    bandwidth, rtt_s, matrix = measure_links(selection, sessions)
    sites = commplan.site_links(matrix, site_map(selection))
    plan = (dataclasses.replace(commplan.plan(bandwidth, len(selection.hosts), gradients.shapes, gradients.settings,
                                              rtt_s=rtt_s, sites=sites), links=matrix)
            if bandwidth else None)
    if comm == AUTO:
        if plan is None:
            hook = Hook.NONE
            renderer.info("comm: auto: no link between hosts to measure (one host, or local): comm.hook=none")
        else:
            hook = plan.recommended
            renderer.info(f"comm: auto: {plan.reason}: comm.hook={hook.value}")
    else:
        hook = Hook(comm)
        floor = plan.floor_of(hook) if plan is not None else None
        if plan is not None:
            at = f"floor {floor.floor_s * 1e3:.1f} ms per step" if floor is not None else "no floor"
            renderer.info(f"comm: comm.hook={hook.value}, {at} "
                          f"(recommended: {plan.recommended.value}; {plan.reason})")
    raised: tuple[str, ...] = ()
    if plan is not None:
        plan = _advised(selection, hook, plan, gradients, renderer, run_timeout(workload, timeout_s, timeout_given))
        raised = (f"{TIMEOUT_OVERRIDE}{plan.timeout.raised_to}",) if plan.timeout and plan.timeout.raised_to else ()
    # The raise goes first, before the hook: the user's own args (a `dist.timeout=` too) all follow the hook,
    # so a resume can tell the controller's raise from the user's and drop it (workload.controller_raise).
    return dataclasses.replace(workload, args=(*raised, f"comm.hook={hook.value}", *workload.args)), plan


def _advised(selection: Selection, hook: Hook, plan: CommPlan, gradients: Gradients, renderer: Renderer,
             timeout: RunTimeout | None) -> CommPlan:
    """The plan with its hints and dist.timeout advice, each said on the console: the advice as a WARN
    when the run's timeout stays under what the collective needs (the user's own, or past the cap)."""
    advice = None if timeout is None else \
        timeout_advice(commplan.largest_collective(plan, hook, gradients.settings), timeout.seconds, timeout.user_set)
    plan = dataclasses.replace(plan, hint=commplan.wire_hint(hook, plan, gradients.shapes, gradients.settings),
                               places_hint=_places_hint(selection, hook, plan, gradients), timeout=advice)
    if plan.hint:
        renderer.info(f"comm: {plan.hint}")
    if plan.places_hint:
        renderer.warn(f"comm: {plan.places_hint}")
    if advice is not None and timeout is not None:
        named = floor_links(plan, hook, advice.collective, site_map(selection))
        if line := timeout_line(advice, timeout.setting, named):
            short = max(advice.raised_to or 0, advice.timeout_s) < advice.needed_s
            (renderer.warn if short else renderer.info)(f"comm: {line}")
    return plan


@dataclasses.dataclass(frozen=True)
class RunTimeout:
    seconds: float  # the run's dist.timeout
    user_set: bool
    setting: str  # how the user sets another: "--timeout " or "dist.timeout=" (after --)


def run_timeout(workload: Workload, timeout_s: int | None, timeout_given: bool) -> RunTimeout | None:
    """The run's dist.timeout: the user's own last `dist.timeout=` override, which follows and so
    beats the controller's `dist.timeout=<--timeout>` (deploy/run/plan.trainer_args; a config file's
    `dist.timeout:` is beaten by both); else --timeout. None for an override that is no number (the
    trainer's --check refused it already)."""
    found = [a[len(TIMEOUT_OVERRIDE):] for a in workload.args if a.startswith(TIMEOUT_OVERRIDE)]
    if not found:  # an unknown --timeout may be the user's own, larger one: never lowered
        return RunTimeout(float(timeout_s or DEFAULT_PG_TIMEOUT_S), timeout_given or timeout_s is None, "--timeout ")
    try:
        return RunTimeout(float(found[-1]), True, TIMEOUT_OVERRIDE)
    except ValueError:
        return None


def timeout_advice(collective: Collective, timeout_s: float, user_set: bool) -> TimeoutAdvice:
    """dist.timeout against TIMEOUT_SAFETY × the collective, rounded up to whole seconds, at most
    the trainer's bound: raised when it is below and not the user's own, to AUTO_RAISE_MAX_S at most
    (`needed_s` still says what it needs); the user's is only advised."""
    needed = min(math.ceil(TIMEOUT_SAFETY * collective.seconds), MAX_PG_TIMEOUT_S)
    target = min(needed, AUTO_RAISE_MAX_S)
    raised = target if timeout_s < target and not user_set else None
    return TimeoutAdvice(collective, timeout_s, user_set, needed, raised)


def timeout_line(advice: TimeoutAdvice, setting: str = "--timeout ", links: str = "") -> str:
    """The console's line: why dist.timeout was raised, or the value to set (`setting`, as the user
    set it) in place of a user's too low one or past the cap; "" when it suffices. `links`: the
    measured links that set the floor (`floor_links`), after the bandwidth."""
    c = advice.collective
    why = (f"the largest collective, {c.what}, {c.nbytes / 1e6:.1f} MB over the slowest link "
           f"({_mbit(c.bandwidth_bytes_s * 8 / 1e6)} Mbit/s{links}), takes about {round(c.seconds)} s")
    if advice.raised_to is not None and advice.raised_to >= advice.needed_s:
        return f"dist.timeout raised to {advice.raised_to} s: {why} ({TIMEOUT_SAFETY}x that; --timeout sets another)"
    if advice.raised_to is not None:  # capped: a host may have misreported its link; a real one is the user's to type
        return (f"dist.timeout raised to {advice.raised_to} s only, the most the controller sets on its own (each "
                f"host reports its own link): under {TIMEOUT_SAFETY}x {why}; check that link, and if it really is "
                f"that slow pass --timeout {advice.needed_s}")
    if advice.timeout_s >= advice.needed_s:
        return ""
    return (f"dist.timeout {advice.timeout_s:g} s is under {TIMEOUT_SAFETY}x {why}: the run may stop with a "
            f"collective timeout; set {setting}{advice.needed_s}")


def _mbit(mbit: float) -> str:
    """Mbit/s as the lines show it: 1 kbit/s (the least a link is held to) is not "0.0"."""
    return f"{mbit:.1f}" if mbit >= 0.05 else f"{mbit:.2g}"


def floor_links(plan: CommPlan, hook: Hook, collective: Collective, site_of: Mapping[str, str]) -> str:
    """The measured links that set the collective's floor, as `timeout_line` names them: the slowest
    host's best link(s) at its bandwidth (commplan.node_bandwidth), then the longest round trip when
    the collective waits on one (the broadcast does not); for hier among the links between, then
    inside sites (commplan.site_links), as its collectives are sized. "" when no link matches."""
    def same(a: str, b: str) -> bool:
        return site_of.get(a) == site_of.get(b)
    groups = [lambda a, b: not same(a, b), same] if hook is Hook.HIER and plan.site_links is not None else []
    for keep in [*groups, lambda a, b: True]:
        links = [link for link in plan.links if keep(link[0], link[1])]
        slowest = _at_bandwidth(links, collective.bandwidth_bytes_s)
        if slowest:
            break
    else:
        return ""
    named = f" on {', '.join(slowest)}"
    rtts = [(f"{a} -> {b}", min(r, commplan.MAX_RTT_MS)) for a, b, _, r in links if r is not None and r >= 0]
    longest = max((r for _, r in rtts), default=0.0)
    if longest <= 0 or collective.seconds == collective.nbytes / collective.bandwidth_bytes_s:
        return named  # no round trip in the floor: the broadcast's is S / B exactly (commplan.largest_collective)
    return f"{named}; round trip {longest:.1f} ms on {', '.join(n for n, r in rtts if r == longest)}"


def _at_bandwidth(links: list[tuple[str, str, float | None, float | None]], bandwidth_bytes_s: float) -> list[str]:
    """"a -> b" for each host's best link(s), held to range as commplan.node_bandwidth holds them, at exactly
    that bandwidth (the same float arithmetic: the slowest host's)."""
    held = [(a, b, min(max(m, commplan.MIN_MBIT_S), commplan.MAX_MBIT_S)) for a, b, m, _ in links
            if m is not None and m > 0]
    best: dict[str, float] = {}
    for a, _, m in held:
        best[a] = max(best.get(a, 0.0), m)
    return [f"{a} -> {b}" for a, b, m in held if m == best[a] and m * 1e6 / 8 == bandwidth_bytes_s]


def _places_hint(selection: Selection, hook: Hook, plan: CommPlan, gradients: Gradients) -> str:
    """check-network's WARN of undeclared places (deploy/check/sites.py), with what hier would do."""
    undeclared = undeclared_places([h.name for h in selection.hosts], {h.name: h.site for h in selection.hosts},
                                   plan.links)
    if undeclared is None:
        return ""
    places, message = undeclared
    return commplan.places_hint(hook, plan, gradients.shapes, gradients.settings, places, message)


def save_plan(runs: Path, run_id: str, plan: CommPlan, hook: str) -> Path:
    """`runs/<run_id>/commplan.json`: the floors the run is judged against (fab report reads it)."""
    path = runs / run_id / COMM_PLAN
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # no NaN or Infinity: load_plan would refuse the file, blaming whoever edited it
        text = json.dumps({"hook": hook, **plan_json(plan)}, indent=2, allow_nan=False)
    except ValueError:
        why = "--comm: the plan holds a number that is not finite; "
        raise MeshrunError(with_path(why, path, " not written")) from None
    atomic_write_bytes(path, (text + "\n").encode())  # a cut write would leave fab report a file it refuses
    return path


def plan_json(plan: CommPlan) -> dict[str, Any]:
    out = dataclasses.asdict(plan)
    out["recommended"] = plan.recommended.value
    out["floors"] = [{**dataclasses.asdict(f), "hook": f.hook.value} for f in plan.floors]
    out["links"] = [{"source": a, "target": b, "mbit_s": m, "rtt_ms": r} for a, b, m, r in plan.links]
    return out


def applied_hook(workload: Workload) -> str:
    """The `comm.hook=` override that takes effect (the last one)."""
    found = [a.split("=", 1)[1] for a in workload.args if a.startswith(COMM_OVERRIDE)]
    return found[-1] if found else Hook.NONE.value


def read_comm_record(sessions: Mapping[str, Session], plan: LaunchPlan) -> dict | None:
    """Rank 0's `comm` record (the trainer's all-reduce probe), from whichever host ran rank 0: its
    `comm` lines only, never the whole metrics file (deploy/edges/commmetrics.py says why)."""
    names = [h.host.name for h in plan.hosts]
    return first_found(sessions, names, comm_record_argv(plan.run_id), 20,
                       lambda result: last_comm_record(result.stdout))


def beside_floor(saved: Mapping[str, Any], measured_s: float | None) -> dict[str, Any]:
    """The summary's `comm` entry: the hook, its floor, the measured time and their ratio."""
    floor = next(f["floor_s"] for f in saved["floors"] if f["hook"] == saved["hook"])
    return {"hook": saved["hook"], "recommended": saved["recommended"], "reason": saved["reason"],
            "bandwidth_mbit_s": round(saved["bandwidth_bytes_s"] * 8 / 1e6, 1), "nodes": saved["nodes"],
            "rtt_ms": round(saved.get("rtt_s", 0.0) * 1e3, 1),
            "floor_s": floor, "measured_s": measured_s, "ratio": _ratio(measured_s, floor)}


def _ratio(measured_s: float | None, floor_s: float) -> float | None:
    """measured / floor, None without both; a huge measured time over a tiny floor gives no inf."""
    ratio = measured_s / floor_s if measured_s is not None and floor_s > 0 else None
    return round(ratio, 2) if ratio is not None and math.isfinite(ratio) else None


def load_plan(runs: Path, run_id: str) -> dict[str, Any] | None:
    """The run's commplan.json (None without one), shaped as `save_plan` writes it, else one line."""
    path = runs / run_id / COMM_PLAN
    fix = "the file is damaged or was edited; remove it (the report then leaves the floors out)"
    data = read_optional(path, RECORD_MAX, "comm plan", fix)
    if data is None:
        return None
    saved = from_json(data.decode("utf-8", "replace"))
    if not _plan_shaped(saved):
        raise InputError(with_path("comm plan ", path, f" is not the shape meshrun writes; {fix}"))
    return saved


def _plan_shaped(saved: object) -> bool:
    """What `beside_floor` reads: three texts, finite numbers >= 0, and a floor for the hook that ran."""
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k), str) for k in ("hook", "recommended", "reason")):
        return False
    numbers = [saved.get("bandwidth_bytes_s"), saved.get("nodes"), saved.get("rtt_s", 0.0)]
    floors = saved.get("floors")
    return (all(is_real(n) and n >= 0 for n in numbers) and isinstance(floors, list)
            and all(isinstance(f, dict) and isinstance(f.get("hook"), str) and is_real(f.get("floor_s")) for f in floors)
            and any(f["hook"] == saved["hook"] for f in floors))
