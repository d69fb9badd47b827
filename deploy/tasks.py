"""The tasks: flags and help only. `fab` finds them through a one-line fabfile
(`from meshrun.deploy.tasks import *`), the `meshrun` command through `meshrun.deploy.program`.
Every behaviour lives in `deploy/commands/<task>.py`, imported lazily so that `-l` stays fast.

Tasks that act on many hosts declare `hosts` themselves: a Fabric task without it is cloned per
host and run one host after another, which would start torchrun on gpu1 and never on gpu2.

Every flag is text or a switch: invoke would convert a number flag itself and end a bad value in a
traceback, so numbers are read by `deploy/run/flags.py` (one line, exit status 2, before any host).
A text flag left out is None, never "": `--inventory "$LAB_INV"` with the variable unset is refused
(`refuse_empty`), not read as "not given" (the project's own inventory, another cluster's).
"""

from __future__ import annotations

import functools
from typing import Callable, ContextManager, Mapping, TypeVar

import fabric
from invoke.exceptions import Exit

from meshrun.deploy.cli import guarded, remainder
from meshrun.deploy.errors import InputError
from meshrun.deploy.fabexec import adopt_running_fab
from meshrun.layout import DEFAULT_PG_TIMEOUT_S
from meshrun.deploy.edges.transport import DEFAULT_CONNECT_TIMEOUT_S
from meshrun.deploy.project import PROJECT_HELP, RUNS_DIR_HELP, Project, find_project
from meshrun.deploy.inventory.load import LOOKUP_ORDER
from meshrun.deploy.run import flags



class _Task(fabric.Task):
    """Flags added later get no short flag: invoke hands short flags out in name order, so a new
    flag would take a letter an older one had (`-b` is --debug's), or, with its letters all taken,
    `-`, which reads as the `--` before a script's arguments."""

    LONG_ONLY = frozenset({"idle_below"})

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict:
        taken = set(taken_names) | ({*name, *name.replace("_", "-")} if name in self.LONG_ONLY else set())
        return super().arg_opts(name, default, taken)


def task(*args, **kwargs):  # type: ignore[no-untyped-def]
    return fabric.task(*args, klass=_Task, **kwargs)


adopt_running_fab()  # `fab train ... -- ARGS`: the arguments after -- go to the script, not to Fabric

__all__ = ["check_network", "fetch_checkpoints", "firewall", "join", "leave", "logs", "report", "setup", "status",
           "stop", "sync", "train", "trust"]

HOSTS_HELP = "hosts, groups or host:0,1 (GPU override), comma-separated; default: all"
INVENTORY_HELP = f"inventory YAML (default, first found: {LOOKUP_ORDER.split(', ', 1)[1]})"
DEBUG_HELP = "show tracebacks of internal errors"
RUN_HELP = "run id (default: the newest run)"
LIVE_RUN_HELP = "run id (default: the newest run that may still be running)"
RUN_INVENTORY_HELP = "inventory YAML to reach the run's hosts through (default: the one the run was started with)"
DEFAULT_LOG_LINES = 50


# Every task takes these two: which project it works on, and where its runs are recorded.
PROJECT_FLAGS = {"project": PROJECT_HELP, "runs_dir": RUNS_DIR_HELP}


# What to give instead of an empty value, per flag (the line that refuses `--inventory ''` says what to do).
EMPTY_FIX = {
    "hosts": "name hosts or groups", "inventory": "name the inventory file", "project": "name the project's folder",
    "runs_dir": "name the folder of the runs", "config": "name the trainer config", "script": "name the script",
    "nnodes": "give MIN:MAX", "timeout": "give the seconds", "resume": "give the id of the run to resume",
    "comm": "name the hook (or auto)", "notify": "give the http(s) URL", "idle_warn": "give the minutes",
    "idle_stop": "give the minutes", "idle_below": "give the percent", "run": "give the run id",
    "frames": "give the number of frames", "lines": "give the number of lines", "dest": "name the folder",
    "data": "give SRC:DEST", "base": "name the interpreter", "reuse_site": "name the interpreter",
}
POSITIONAL = {"action": ("firewall action", "give up, down or status")}  # firewall's
F = TypeVar("F", bound=Callable[..., object])


def refuse_empty(given: Mapping[str, object]) -> None:
    """An explicitly empty value (`--resume ""`: a script's unset variable) is refused in one line: read
    as "not given", it would fall back to the project's inventory or start a fresh run, unsaid."""
    for name, value in given.items():
        if value != "" and not (isinstance(value, list) and "" in value):  # a repeatable flag: each value
            continue
        if name in POSITIONAL:
            what, fix = POSITIONAL[name]
            raise InputError(f"{what} '': empty; {fix}, or leave it out")
        fix = EMPTY_FIX.get(name, "give a value")
        raise InputError(f"--{name.replace('_', '-')} '': empty; {fix}, or leave the flag out")


def _guarded(fn: F) -> F:
    """`guarded` (one line, exit status 2) around the task, which first refuses an empty flag value."""
    @functools.wraps(fn)
    def body(*args: object, **kwargs: object) -> object:
        refuse_empty(kwargs)
        return fn(*args, **kwargs)

    return guarded(body)  # type: ignore[arg-type]


def _exit(code: int) -> None:
    if code:
        raise Exit(code=code)


def _project(project: str | None, runs_dir: str | None, writes: bool = False) -> Project:
    return find_project(project or None, runs_dir or None, writes=writes)


def _through(inventory: str | None) -> ContextManager[None]:
    """A task on recorded runs reaches their hosts through `--inventory` when given, else each run's own
    (a checkout moved or cloned since, or a run folder copied: the record's inventory may be gone)."""
    from meshrun.deploy.edges.agents import inventory_given

    return inventory_given(inventory or None)


@task(help={**PROJECT_FLAGS, 
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "json": "print the facts and verdicts as JSON",
    "bandwidth": "also measure each link's throughput (about 1 s per link)",
    "timeout": f"SSH connect timeout per host in seconds (default {DEFAULT_CONNECT_TIMEOUT_S:g}): what a dead host costs",
    "debug": DEBUG_HELP,
})
@_guarded
def check_network(c, hosts=None, inventory=None, json=False, bandwidth=False, timeout=None, project=None, runs_dir=None, debug=False):
    """Pre-flight check: SSH, versions, GPUs, overlay, all-to-all ports, MTU, and a gloo all-reduce."""
    from meshrun.deploy.commands.check import CheckRequest, main

    seconds = flags.connect_timeout(timeout, DEFAULT_CONNECT_TIMEOUT_S)
    _exit(main(CheckRequest(inventory or None, hosts or None, bool(json), bool(bandwidth), seconds), _project(project, runs_dir)))


@task(help={**PROJECT_FLAGS, 
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP, "yes": "trust new keys without asking (check the fingerprints!)",
    "timeout": f"connect timeout per host in seconds (default {DEFAULT_CONNECT_TIMEOUT_S:g})", "debug": DEBUG_HELP,
})
@_guarded
def trust(c, hosts=None, inventory=None, yes=False, timeout=None, project=None, runs_dir=None, debug=False):
    """Show each host's SSH key fingerprint and add new keys to the inventory's known_hosts (asks first)."""
    from meshrun.deploy.commands.trust import TrustRequest, main

    seconds = flags.connect_timeout(timeout, DEFAULT_CONNECT_TIMEOUT_S)
    _exit(main(TrustRequest(inventory or None, hosts or None, bool(yes), seconds), _project(project, runs_dir)))


@task(help={**PROJECT_FLAGS, "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "base": "interpreter on the host that creates the venv (default python3)",
            "reuse_site": "let the venv also see this interpreter's packages (e.g. a shared env with torch)",
            "install_project": "also the project itself when it is a package (pip install --no-deps -e .); "
                               "--no-install-project leaves it out",
            "debug": DEBUG_HELP})
@_guarded
def setup(c, hosts=None, inventory=None, base="python3", reuse_site=None, project=None, runs_dir=None, debug=False,
          install_project=True):
    """Prepare each remote host's Python: <workdir>/.venv with this meshrun and the project's requirements (idempotent)."""
    from meshrun.deploy.commands.setup import main

    reuse = flags.host_program("--reuse-site", reuse_site) if reuse_site else None
    main(inventory or None, hosts or None, flags.host_program("--base", base), reuse, _project(project, runs_dir),
         bool(install_project))


@task(help={**PROJECT_FLAGS, "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
            "data": "also a dataset: SRC:DEST (local dir : dir on each host, relative to its workdir or absolute)",
            "timeout": "seconds each host's sync may take, code and --data alike (default 900); a sync cut short "
                       "resumes when run again",
            "debug": DEBUG_HELP})
@_guarded
def sync(c, hosts=None, inventory=None, data=None, project=None, runs_dir=None, debug=False, timeout=None):
    """Copy the project's code (git-tracked and untracked-not-ignored files), and --data, to each host."""
    from meshrun.deploy.commands.sync import SYNC_TIMEOUT_S, main

    seconds = flags.whole("--timeout", timeout or "", SYNC_TIMEOUT_S, flags.MAX_SYNC_TIMEOUT_S, "7200")
    main(inventory or None, hosts or None, data or None, _project(project, runs_dir), seconds)


@task(help={**PROJECT_FLAGS, 
    "hosts": HOSTS_HELP, "inventory": INVENTORY_HELP,
    "config": "trainer config YAML, its path relative to the project root (not the current directory), or the name "
              "of a shipped one (default digits.yaml)",
    "script": "run this torchrun-compatible script of the project instead of the trainer (its path relative to the "
              "project root, not the current directory); its arguments go after --",
    "nnodes": "elastic bounds MIN:MAX (default: the inventory's `elastic`, else fixed; a plain N, fixed, must be "
              "the number of hosts selected)",
    "timeout": f"the built-in trainer's process-group timeout in whole seconds (default {DEFAULT_PG_TIMEOUT_S}; a "
               "resume: the run's): how long a lost peer may stall a collective",
    "detach": "start the run and return its id", "skip_checks": "skip the pre-flight checks",
    "no_sync": "do not sync the code first", "debug": DEBUG_HELP,
    "resume": "continue an earlier run (its id) from its newest checkpoint, on its hosts by default",
    "comm": "gradient communication: none|fp16|bf16|powersgd|localsgd|diloco|diloco-overlap|hier (DDP inside each "
            "site, DiLoCo between sites), or auto (measure bandwidth and RTT, pick by the floor)",
    "firewall": "fab firewall up on the hosts for the run's duration (down afterwards, whatever happens)",
    "notify": "POST the run's events as JSON to this http(s) URL (repeatable; a secret: never shown or recorded)",
    "idle_warn": "warn when a host stays idle (under 10% GPU use; CPU hosts: its busiest run process under 10% of a core) this many minutes (default 10; decimals allowed)",
    "idle_stop": "stop the run when a host stays idle this many minutes",
    "idle_below": "idle means under this many percent of GPU use (CPU hosts: of a core), default 10",
    "every_checkpoint": "with --notify: also an event for each newer checkpoint a host lists (checked every few seconds)",
}, iterable=["notify"])
@_guarded
def train(c, hosts=None, inventory=None, config=None, script=None, nnodes=None, timeout=None,
          detach=False, skip_checks=False, no_sync=False, resume=None, comm=None, firewall=False, notify=None,
          idle_warn=None, idle_stop=None, idle_below=None, every_checkpoint=False, project=None, runs_dir=None, debug=False):
    """Train on the selected hosts: one synchronized torchrun per host, live logs, summary."""
    from meshrun.deploy.commands.train import TrainRequest, main
    from meshrun.deploy.run.idle import policy_from_flags
    from meshrun.deploy.run.plan import Workload

    workload = Workload(script=script or None, config=config or None, args=remainder())
    idle = policy_from_flags(idle_warn, idle_stop, idle_below)
    request = TrainRequest(inventory or None, hosts or None, workload, nnodes=nnodes or None,
                           pg_timeout_s=flags.pg_timeout(timeout, DEFAULT_PG_TIMEOUT_S) if timeout else None,
                           detach=detach, skip_checks=skip_checks, no_sync=no_sync, resume=resume or None,
                           comm=comm or None, firewall=firewall, notify=tuple(notify or ()), idle=idle,
                           every_checkpoint=bool(every_checkpoint))
    _exit(main(request, _project(project, runs_dir, writes=True)))  # --firewall's bracket: deploy/commands/train.main


@task(help={**PROJECT_FLAGS, "run": "run id (default: every recorded run that may still be running)", "json": "print JSON for scripts",
            "watch": "a live view of the run (default: the newest that may still be running), every 2 s; Ctrl-C leaves it",
            "frames": "with --watch: print this many frames, then exit (for scripts; default: until Ctrl-C)",
            "debug": DEBUG_HELP, "inventory": RUN_INVENTORY_HELP})
@_guarded
def status(c, run=None, json=False, watch=False, frames=None, project=None, runs_dir=None, debug=False,
           inventory=None):  # new flags last: the older ones keep their short forms
    """Runs, hosts, state, epoch/step and uptime, read from the hosts."""
    from meshrun.deploy.commands.status import main
    from meshrun.deploy.run.watchview import parse_frames

    with _through(inventory):
        main(run or None, bool(json), _project(project, runs_dir), bool(watch), parse_frames(frames))


@task(help={**PROJECT_FLAGS, "run": LIVE_RUN_HELP, "follow": "keep printing new lines until Ctrl-C", "lines": f"lines per host (default {DEFAULT_LOG_LINES})",
            "debug": DEBUG_HELP, "inventory": RUN_INVENTORY_HELP})
@_guarded
def logs(c, run=None, follow=False, lines=None, project=None, runs_dir=None, debug=False, inventory=None):
    """Show a run's logs from every host, prefixed [host:rank]."""
    from meshrun.deploy.commands.logs import main

    with _through(inventory):
        main(run or None, bool(follow), flags.log_lines(lines, DEFAULT_LOG_LINES), _project(project, runs_dir))


@task(help={**PROJECT_FLAGS, "run": LIVE_RUN_HELP, "debug": DEBUG_HELP, "inventory": RUN_INVENTORY_HELP})
@_guarded
def stop(c, run=None, project=None, runs_dir=None, debug=False, inventory=None):
    """Stop a run on every host (TERM, grace, KILL) and confirm no run process is left."""
    from meshrun.deploy.commands.stop import main

    with _through(inventory):
        _exit(main(run or None, _project(project, runs_dir)))


@task(help={**PROJECT_FLAGS, "run": "the elastic run's id", "hosts": "hosts to add", "debug": DEBUG_HELP,
            "inventory": RUN_INVENTORY_HELP})
@_guarded
def join(c, run=None, hosts=None, project=None, runs_dir=None, debug=False, inventory=None):
    """Add hosts to a running elastic run: same rendezvous, the world grows."""
    from meshrun.deploy.commands.membership import main

    with _through(inventory):
        main("join", run, hosts, _project(project, runs_dir, writes=True))


@task(help={**PROJECT_FLAGS, "run": "the elastic run's id", "hosts": "hosts to remove", "debug": DEBUG_HELP,
            "inventory": RUN_INVENTORY_HELP})
@_guarded
def leave(c, run=None, hosts=None, project=None, runs_dir=None, debug=False, inventory=None):
    """Remove hosts from a running elastic run gracefully; it goes on while its minimum holds."""
    from meshrun.deploy.commands.membership import main

    with _through(inventory):
        main("leave", run, hosts, _project(project, runs_dir, writes=True))


@task(name="fetch-checkpoints", help={**PROJECT_FLAGS, 
    "run": RUN_HELP, "dest": "where runs live locally (default: where this controller records them)",
    "force": "overwrite local files you changed that differ from the hosts' copies",
    "every_copy": "bring every host's copy of the checkpoints, not only the newest holder's",
    "prune": "then remove the checkpoints fetched earlier that are older than the oldest of the hosts still in "
             "the run (all of them answering; never a file a host lists or you changed, never the newest, never "
             "best.pt)", "debug": DEBUG_HELP,
    "inventory": RUN_INVENTORY_HELP})
@_guarded
def fetch_checkpoints(c, run=None, dest=None, force=False, project=None, runs_dir=None, debug=False, every_copy=False,
                      prune=False, inventory=None):  # new flags last: the older ones keep their short forms (-p is --project)
    """Bring a run home: verified checkpoints + manifest, and every host's logs and metrics."""
    from meshrun.deploy.commands.fetch import main

    with _through(inventory):
        _exit(main(run or None, dest or None, bool(force), _project(project, runs_dir, writes=not dest),
                   bool(every_copy), bool(prune)))


@task(help={**PROJECT_FLAGS, "run": RUN_HELP, "json": "print JSON for scripts", "debug": DEBUG_HELP})
@_guarded
def report(c, run=None, json=False, project=None, runs_dir=None, debug=False):
    """Throughput per host and rank, step-time breakdown, final and best accuracy, and a PNG of the curves."""
    from meshrun.deploy.commands.report import main

    main(run or None, bool(json), _project(project, runs_dir))


# `action` defaults to None: invoke fills a positional argument only while its value is still None.
@task(positional=["action"], help={**PROJECT_FLAGS, "action": "up | down | status (default status)", "hosts": HOSTS_HELP,
                                   "inventory": INVENTORY_HELP, "debug": DEBUG_HELP})
@_guarded
def firewall(c, action=None, hosts=None, inventory=None, project=None, runs_dir=None, debug=False):
    """Each host's own iptables: allow SSH and the member hosts on the training interface, refuse other TCP."""
    from meshrun.deploy.commands.firewall import FirewallRequest, main

    _exit(main(FirewallRequest(action or "status", inventory or None, hosts or None), _project(project, runs_dir)))
