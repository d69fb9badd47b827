"""What `fab train` runs, pure: the flags only the built-in trainer reads, and what a resume runs.

A resume (`fab train --resume ID`) runs what the run ran: the record's script or config and
arguments, and its `--timeout`. The hint every fetch and every elastic failure prints is a bare
`fab train --resume ID`; without the record's workload it ran the built-in trainer's defaults in
the run's directory (a script's run became a digits run; `-- epochs=100` became 20, "succeeded" at
once). The resume may add to it: the built-in trainer's `key=value` overrides go after the
recorded ones (the last of a key wins, so `-- epochs=200` extends a run), a script's arguments
replace the recorded ones (they cannot be merged). Another script or config is refused: the
run's checkpoints are that workload's. `--comm`'s own raise of `dist.timeout` is carried over, at
most AUTO_RAISE_MAX_S: it was sized on links measured at an earlier start, each reported by its host
(a record from before the cap may hold a day's raise, one host's word).
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from meshrun.deploy.errors import InputError
from meshrun.deploy.run.plan import Workload

COMM_OVERRIDE = "comm.hook="  # --comm's override (deploy/edges/comm.py): a new --comm decides anew
TIMEOUT_OVERRIDE = "dist.timeout="  # comm.py's too, when it raises the run's timeout (`controller_raise`)
# The most the controller raises dist.timeout on its own (deploy/edges/comm.py), and keeps on a resume: 30 min,
# gloo's own default. The honest cases measured need less: ViT-B/16's 346 MB on a 20 Mbit/s home link, 3x its
# largest collective is 418 s on 2 nodes and 627 s for DiLoCo on 4 (docs/performance.md,
# tests/test_comm_timeout.py), and a link 2.5x slower still fits. The link speeds are each host's own answer,
# and a stalled collective holds every rank's GPU (and an attached `fab train`) for dist.timeout: one host
# answering 1 kbit/s raised it to a day. Past this, only a typed --timeout raises it.
AUTO_RAISE_MAX_S = 1800


@dataclass(frozen=True)
class ResumedWork:
    workload: Workload
    pg_timeout_s: int  # the resume's --timeout, else the run's
    note: str | None  # the line that says what came from the record


def refuse_trainer_flags(workload: Workload, timeout_given: bool) -> None:
    """--config and --timeout are the built-in trainer's: with --script they were dropped without a
    word, and a script's own `--config` typed before `--` ran the script without it."""
    if workload.script is None:
        return
    if workload.config is not None:
        raise InputError(f"--config is the built-in trainer's; your script's own flags go after --: fab train "
                         f"--script {shlex.quote(workload.script)} -- --config {shlex.quote(workload.config)}")
    if timeout_given:
        raise InputError("--timeout is the built-in trainer's process-group timeout; a --script sets its own "
                         "(init_process_group(timeout=...))")


def recorded_workload(work: dict) -> Workload:
    """A run record's `workload` (its fields checked by deploy/edges/records.py) as a Workload."""
    return Workload(work.get("script"), work.get("config"), tuple(work.get("args", ())))


def described(workload: Workload) -> str:
    """The workload as the flags that give it, e.g. `--script train.py -- --epochs 100`."""
    words = ["--script", workload.script] if workload.script else ["--config", workload.config] if workload.config \
        else []
    head = shlex.join(words) if words else "the built-in trainer"
    return f"{head} -- {shlex.join(workload.args)}" if workload.args else head


def resumed_work(run_id: str, recorded: Workload, recorded_timeout: int, given: Workload, given_timeout: int | None,
                 new_comm: bool) -> ResumedWork:
    """What the resume of run `run_id` runs (see the module doc). `new_comm`: the resume has --comm,
    which then chooses the hook instead of the record's `comm.hook=`, and the timeout anew; a typed
    --timeout (`given_timeout`) is the run's timeout: neither keeps the record's `controller_raise`,
    which otherwise stays, held to AUTO_RAISE_MAX_S (the note says so when that lowers it)."""
    _refuse_another(run_id, recorded, given)
    timeout = given_timeout if given_timeout is not None else recorded_timeout
    lowered = ""
    if recorded.script:
        args = given.args or recorded.args
    else:
        recorded_args = recorded.args
        if controller_raise(recorded.args):
            anew = new_comm or given_timeout is not None
            held = _held_raise(recorded.args[0])
            recorded_args = recorded.args[1:] if anew else (held, *recorded.args[1:])
            lowered = "" if anew or held == recorded.args[0] else (
                f"; {recorded.args[0]} (--comm's raise, from the links each host reported) is held to {held}: "
                "pass --timeout N if the links really are that slow")
        kept = tuple(a for a in recorded_args if not (new_comm and a.startswith(COMM_OVERRIDE)))
        args = (*kept, *given.args)
    workload = dataclasses.replace(given, script=recorded.script, config=recorded.config, args=args)
    taken = workload != given and (recorded.script or recorded.config or recorded.args)
    note = f"resume: run {run_id} runs as it ran: {described(workload)}{lowered}" if taken else None
    return ResumedWork(workload, timeout, note)


def _held_raise(arg: str) -> str:
    """A recorded `dist.timeout=N` raise, N held to AUTO_RAISE_MAX_S (a value not a whole number: the cap)."""
    value = arg[len(TIMEOUT_OVERRIDE):]
    seconds = int(value) if value.isascii() and value.isdigit() else AUTO_RAISE_MAX_S
    return f"{TIMEOUT_OVERRIDE}{min(seconds, AUTO_RAISE_MAX_S)}"


def controller_raise(args: tuple[str, ...]) -> bool:
    """Whether the recorded args open with `--comm`'s raise of the timeout: a `dist.timeout=` right before
    the first `comm.hook=`, where deploy/edges/comm.choose puts it (the user's own args follow the hook)."""
    return len(args) > 1 and args[0].startswith(TIMEOUT_OVERRIDE) and args[1].startswith(COMM_OVERRIDE)


def resumed_nnodes(recorded: tuple[int, int] | None, hosts: int) -> str | None:
    """`--nnodes` for a resume that gives none: the run's own bounds (it was elastic: a resume without
    them was not, unless the inventory said so), MIN at most the hosts resumed on (one died)."""
    if recorded is None:
        return None
    low, high = recorded
    return f"{min(low, hosts)}:{high}"


def _refuse_another(run_id: str, recorded: Workload, given: Workload) -> None:
    if recorded.script:
        if given.script is not None and given.script != recorded.script:
            raise InputError(f"--resume {run_id}: that run ran --script {shlex.quote(recorded.script)}, not --script "
                             f"{shlex.quote(given.script)}; resume it with the same --script (or none)")
        if given.config is not None:
            raise InputError(f"--resume {run_id}: that run ran --script {shlex.quote(recorded.script)}; --config is the "
                             "built-in trainer's: your script's own flags go after --")
        return
    if given.script is not None:
        raise InputError(f"--resume {run_id}: that run ran {described(recorded)}, not --script "
                         f"{shlex.quote(given.script)}; its checkpoints are the trainer's: start a new run for the script")
    if given.config is not None and given.config != recorded.config:
        was = f"--config {shlex.quote(recorded.config)}" if recorded.config else "the trainer's default config"
        raise InputError(f"--resume {run_id}: that run ran {was}, not --config {shlex.quote(given.config)}; leave "
                         "--config out (key=value overrides after -- still apply)")
