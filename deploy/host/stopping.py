"""Stopping a run's processes on a host short of the run's own end, for the agent (deploy/host/agent.py):
the signals that stop its run, the `stop` verb (`fab stop`), and the restart of a worker group with
what the group left behind. Standard library only: it runs on hosts.

The signals (`stop_signals`): SIGTERM always; SIGHUP and SIGINT unless the agent was started
ignoring them (`nohup`), as the controller does (deploy/stopsignals.py). Why, in its docstring.

`cmd_stop`: the run found through its pidfile and run id; its agent TERMed, so that it stops its
own run gracefully; then TERM the process group, a grace period, KILL; then every process tagged
with the run's MESHRUN_RUN_ID and MESHRUN_HOST (torchrun starts each worker in a session of its
own, out of reach of the group). Never by name. Prints JSON.

A worker group's restart. The agent is its run's child subreaper (deploy/host/procs.py): a process
a worker started in a session of its own (an eval or inference process on the GPU, a data server)
is re-parented to the agent when that worker ends. Two things end a worker group while torchrun
lives on:

- meshrun's own restart (`restart_group`): the controller's `restart` line for a cut peer, or a
  detached run's peer watcher. It SIGKILLs the workers, what they started and the adopted orphans.
- torch's own restart (`GroupWatch`): a worker raised, or a peer died and the survivors'
  collectives failed, and torchrun (`--max-restarts`) stops the group and starts a new one. It
  stops each worker with `os.killpg` of the worker's own group (torch's `SubprocessHandler.close`),
  which misses a helper in a session of its own: that helper ran on, holding its GPU's memory
  against the new group (which could run out of it), one more with each restart, until the run
  ended. The agent sees a new worker appear among torchrun's children and SIGKILLs the adopted
  orphans that started before the oldest worker now running. A helper the current group started
  is younger than its worker, so it is spared; one meant to outlive a restart must be started
  again by the new group.

Why start times, in clock ticks since boot (/proc/PID/stat), and not "what was there when the
agent noticed": on a loaded machine the agent may see the new group late, or never see a
short-lived group at all (a worker that fails on import within one poll), and the kernel's order of
starts holds whatever the agent saw when.

Cheap, as the watch loop looks five times a second all run long: a look reads torchrun's children
(a few small files); their stat files only when that set changed, and a scan of /proc only when a
new worker appeared.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from meshrun.layout import AGENT_PIDFILE, host_dir
from meshrun.deploy.host.agentstart import read_json
from meshrun.deploy.host.procs import (POLL_S, adopted_orphans, alive, children, is_agent, reap_adopted,
                                       session_leader_start, signal_all, tagged_pids, terminate_run, with_offspring)


def stop_signals() -> list[signal.Signals]:
    """The signals the agent stops its run on. SIGHUP and SIGINT only where it was not started
    ignoring them, as the controller does (deploy/stopsignals.py): an `address: local` host's agent
    is the controller's child in its process group, so under `nohup fab train` the closed terminal's
    SIGHUP to that group stopped the local part, and with it a run the controller meant to go on.
    SIGTERM always: it is how the agent is asked to stop (`agent stop`, i.e. `fab stop`; a detached
    start TERMs a copy past its window), never the terminal's doing. Ignored, it would leave `fab
    stop` to kill the workers under a running agent after its grace, and the agent to record their
    end as the command's own ("exited", not "stopped")."""
    return [signal.SIGTERM, *(s for s in (signal.SIGHUP, signal.SIGINT) if signal.getsignal(s) is not signal.SIG_IGN)]


def cmd_stop(args: argparse.Namespace) -> int:
    """`agent stop` (see the module docstring): 0 when nothing of the run is left, else 1."""
    run_id = args.run_id
    record = read_json(Path(host_dir(run_id, args.host)) / AGENT_PIDFILE) or {}
    agent_pid = record.get("agent_pid")
    agent_alive = bool(agent_pid and alive(agent_pid) and is_agent(agent_pid, run_id))
    # The agent counts: between two worker starts (a restart, a rendezvous) nothing else may be tagged,
    # and `fab stop` must not call a run it stops "already ended".
    was_running = bool(tagged_pids(run_id, args.host)) or agent_alive
    if agent_alive:
        os.kill(agent_pid, signal.SIGTERM)  # it stops its own run gracefully
        deadline = time.monotonic() + args.grace + 5
        while alive(agent_pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    left = terminate_run(run_id, args.host, record.get("pgid"), args.grace, record.get("pgid_start"))
    print(json.dumps({"host": args.host, "run_id": run_id, "was_running": was_running, "remaining": left}))
    return 0 if not left else 1


def restart_group(workers: list[int], agent: int, torchrun: int) -> None:
    """SIGKILL `workers` with what they started, tags or not, and the orphans they left with `agent`,
    whatever their age: a process of the old group that outlived it would hold its GPU's memory
    against the new one. Not torchrun: its elastic agent sees failed workers and re-rendezvouses."""
    signal_all(None, with_offspring(workers, agent, torchrun), signal.SIGKILL)


@dataclass
class GroupWatch:
    """torchrun's worker groups as the agent's watch loop sees them, one per torchrun; see the module
    docstring."""

    agent: int
    torchrun: int
    children: frozenset[int] = frozenset()  # torchrun's children at the last look
    workers: frozenset[tuple[int, int]] = frozenset()  # (pid, start time) of those that were workers
    unsure: bool = False  # a child of the last look was no worker (yet): look at it again

    def look(self) -> list[int]:
        """Reap the exited adopted orphans; when a worker appeared since the last look, SIGKILL the
        adopted orphans older than the oldest worker now running. The pids killed."""
        reap_adopted(self.agent, self.torchrun)
        now = frozenset(children(self.torchrun))
        if now == self.children and not self.unsure:
            return []
        self.children = now
        workers = frozenset((pid, began) for pid in now if (began := session_leader_start(pid)) is not None)
        self.unsure = len(workers) < len(now)
        appeared, self.workers = workers - self.workers, workers
        if not appeared:
            return []
        # The oldest live worker, not the newest: a group seen half-started is still one group.
        left = adopted_orphans(self.agent, self.torchrun, started_before=min(began for _, began in workers))
        signal_all(None, left, signal.SIGKILL)
        return left


def swept_line(killed: list[int]) -> str:
    """What the agent says when a look killed something (train.log, the controller, the journal)."""
    return (f"torch restarted the worker group; killed {len(killed)} process(es) the last group left running "
            f"in a session of their own: {' '.join(map(str, sorted(killed)))}")
