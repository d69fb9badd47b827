"""A code sync under a running run, pure: which runs a host's busy answer names, the one line that
refuses the sync, and the guard a remote code sync runs before its rsync (deploy/commands/sync.py
asks every host for `fab sync`; deploy/edges/sync.py runs the guard for every code sync: the effects
are there)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence

from meshrun.layout import is_run_id
from meshrun.deploy.run.shell import shell_path

# The run ids in the host-side test's busy answer (deploy/host/setup.py `runs_error`: at most 8, then ", ...").
BUSY_RE = re.compile(r"runs? (.+?) (?:is|are) running from this workdir")
BUSY_SAID = "meshrun-workdir-busy:"  # on the code sync's stderr, before the host-side test's answer
BUSY_EXIT = 96  # the guard's exit status then: the rsync never starts
# The guard's test is given this long, well inside rsync's own 60 s without data (edges/rsyncrun.py), and this
# much of its answer is read: an interpreter that hangs or floods (a broken or hostile host) lets the sync go on.
GUARD_TIMEOUT_S = 30
GUARD_ANSWER_MAX = 4096
WHY = "a worker restart or a --resume would import the new code beside the old"


def busy_runs(error: str) -> tuple[str, ...]:
    """The runs a busy answer names, or () when it names none in the host-side test's own words."""
    return _named(BUSY_RE.match(error))


def busy_guard(test: Sequence[str], seconds: int = GUARD_TIMEOUT_S) -> str:
    """The shell command a remote code sync runs in the workdir before its rsync: `fab sync`'s host-side
    test (the argv `test`, edges/sync.busy_test_argv: the runs' interpreter first) within `seconds`, and when
    it answers busy, that answer on stderr after BUSY_SAID in printable ASCII only, and exit BUSY_EXIT. No
    answer (no such interpreter there: none of its runs runs there; or none in time, or no `timeout`
    program) lets the sync go on."""
    shown = " ".join(["timeout", str(seconds), shell_path(test[0]), *map(shlex.quote, test[1:])])
    return (f'o=$({shown} 2>/dev/null | head -c {GUARD_ANSWER_MAX}); case "$o" in *\'"busy": true\'*) '
            f"printf '%s %s\\n' {BUSY_SAID} \"$o\" | tr -cd '\\040-\\176\\n' >&2; exit {BUSY_EXIT};; esac")


def guard_said(message: str) -> tuple[str, ...] | None:
    """What a failed code sync's message (rsync's stderr, quoted) says the guard found: the runs its
    answer names, () when it said busy in other words; None when the guard said nothing."""
    at = message.find(BUSY_SAID)
    if at < 0:
        return None
    return _named(BUSY_RE.search(message, at))


def _named(found: re.Match[str] | None) -> tuple[str, ...]:
    runs = tuple(found.group(1).removesuffix(", ...").split(", ")) if found else ()
    return runs if runs and all(is_run_id(r) for r in runs) else ()


def under_runs(busy: Mapping[str, tuple[str, ...]], ours: Callable[[str, str], bool] = lambda run, host: True,
               doing: str = "fab sync", synced: str = "nothing was synced") -> str:
    """One line: which run runs from which hosts' workdirs, and what to do. A host's answer names
    the runs: `fab stop --run` is advised only for a run `ours(run, host)`, one whose record here lists
    that host; a run a host names that no record here puts on it may be its own invention (stopping a
    real run of the same id elsewhere on its word) or another controller's: said, with no stop advised.
    `doing`: what would have changed the code; `synced`: what it did meanwhile."""
    why = f"{WHY}; {synced}"
    foreign = {host: [run for run in runs if not ours(run, host)] for host, runs in busy.items()}
    if named := {host: runs for host, runs in foreign.items() if runs}:
        said_by = "; ".join(f"{host} says {', '.join(runs)}" for host, runs in named.items())
        return (f"a run this controller has no record of on that host is running from its workdir ({said_by}): "
                f"{doing} would change the code it runs from ({why}); stop it where it was started, or wait")
    where: dict[str, list[str]] = {}
    for host, runs in busy.items():
        for run in runs:
            where.setdefault(run, []).append(host)
    if not where:  # busy, in words of another version: no run named
        return (f"a run is running from the workdir of {', '.join(busy)}: {doing} would change the code it runs from "
                f"({why}); stop it first (fab status names it) or wait for it to end")
    if len(where) == 1:
        [(run, hosts)] = where.items()
        return (f"run {run} is running from the workdir of {', '.join(hosts)}: {doing} would change the code it "
                f"runs from ({why}); stop it first (fab stop --run {run}) or wait for it to end")
    runs = ", ".join(f"{run} (on {', '.join(hosts)})" for run, hosts in where.items())
    return (f"runs {runs} are running from these hosts' workdirs: {doing} would change the code they run from "
            f"({why}); stop them first (fab stop --run ID, for each) or wait for them to end")
