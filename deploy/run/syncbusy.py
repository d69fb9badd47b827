"""`fab sync` under a running run, pure: which runs a host's busy answer names, and the one line
that refuses the sync (deploy/commands/sync.py asks every host; the effects are there)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from meshrun.layout import is_run_id

# The run ids in the host-side test's busy answer (deploy/host/setup.py `runs_error`: at most 8, then ", ...").
BUSY_RE = re.compile(r"runs? (.+?) (?:is|are) running from this workdir")


def busy_runs(error: str) -> tuple[str, ...]:
    """The runs a busy answer names, or () when it names none in the host-side test's own words."""
    found = BUSY_RE.match(error)
    runs = tuple(found.group(1).removesuffix(", ...").split(", ")) if found else ()
    return runs if runs and all(is_run_id(r) for r in runs) else ()


def under_runs(busy: Mapping[str, tuple[str, ...]], ours: Callable[[str, str], bool] = lambda run, host: True) -> str:
    """One line: which run runs from which hosts' workdirs, and what to do. A host's answer names
    the runs: `fab stop --run` is advised only for a run `ours(run, host)`, one whose record here lists
    that host; a run a host names that no record here puts on it may be its own invention (stopping a
    real run of the same id elsewhere on its word) or another controller's: said, with no stop advised."""
    why = "a worker restart or a --resume would import the new code beside the old; nothing was synced"
    foreign = {host: [run for run in runs if not ours(run, host)] for host, runs in busy.items()}
    if named := {host: runs for host, runs in foreign.items() if runs}:
        said_by = "; ".join(f"{host} says {', '.join(runs)}" for host, runs in named.items())
        return (f"a run this controller has no record of on that host is running from its workdir ({said_by}): "
                f"fab sync would change the code it runs from ({why}); stop it where it was started, or wait")
    where: dict[str, list[str]] = {}
    for host, runs in busy.items():
        for run in runs:
            where.setdefault(run, []).append(host)
    if len(where) == 1:
        [(run, hosts)] = where.items()
        return (f"run {run} is running from the workdir of {', '.join(hosts)}: fab sync would change the code it "
                f"runs from ({why}); stop it first (fab stop --run {run}) or wait for it to end")
    runs = ", ".join(f"{run} (on {', '.join(hosts)})" for run, hosts in where.items())
    return (f"runs {runs} are running from these hosts' workdirs: fab sync would change the code they run from "
            f"({why}); stop them first (fab stop --run ID, for each) or wait for them to end")
