"""The contract between the controller, the host agent and the trainer: where a run's files
live, what they are called, the `MESHRUN_*` environment names, and the timing constants both
sides must agree on. Standard library only; every value here is written once.

A run is named by its run id alone. The controller hands it to the host agent (`--run-id`), the
agent tags torchrun and every worker with `MESHRUN_RUN_ID`, and the trainer reads that variable;
every directory below is derived from the id by the functions here, on each side.
"""

from __future__ import annotations

import enum
import re

RUNS_DIR = "runs"  # relative to the project on the controller and to the workdir on a host

# Environment the agent sets for torchrun and its workers.
ENV_RUN_ID = "MESHRUN_RUN_ID"
ENV_HOST = "MESHRUN_HOST"
# The run directory on the host, absolute: where a --script writes what comes home (`runs/<id>/hosts/<host>/output`
# where the workdir is the project itself: there `runs/<id>/` holds the controller's own records).
ENV_RUN_DIR = "MESHRUN_RUN_DIR"
ENV_BATCH_SIZE = "MESHRUN_BATCH_SIZE"  # this host's per-process batch size, or "auto"
ENV_SITE = "MESHRUN_SITE"  # the inventory's `site:` of this host; unset: the host is a site of its own

# The controller's ssh_config (HostName, User, Port, IdentityFile, ProxyJump); default ~/.ssh/config.
ENV_SSH_CONFIG = "MESHRUN_SSH_CONFIG"

# Files of a run directory (`runs/<run_id>/`).
LAUNCH_RECORD = "launch.json"  # controller: what was started where
RECORD_LOCK = ".record.lock"  # controller: flock held while a `fab join` re-reads and rewrites launch.json
SUMMARY = "summary.json"  # controller: the outcome, a user contract
COMM_PLAN = "commplan.json"  # controller: `--comm` floors and choice
PROVENANCE = "provenance.json"  # controller: a detached run's provenance at launch (fab report adds the fetched end)
METRICS = "metrics.jsonl"  # trainer, rank 0
RANK_METRICS_GLOB = "metrics.rank*.jsonl"  # trainer, every rank: its step records (rank_metrics)
PROGRESS = "progress.json"  # trainer, rank 0: epoch and step, for `fab status`
RESULT = "result.json"  # trainer, rank 0: final metrics
# Worker-group starts per launch (`{launch rendezvous id: starts}`), summary.json's `restarts`: the trainer's
# host leaders (train/starts.py), or a --script's runner on each host (deploy/host/runscript.py keeps a copy).
STARTS_FILE = "starts.json"
CHECKPOINTS = "checkpoints"  # trainer: ckpt-step<9 digits>.pt, best.pt, MANIFEST.sha256
HOSTS = "hosts"  # per-host subdirectories
# The reason an agent stops its run for this controller's silence (exit.json), which the controller's
# summary reads back as "this controller was silent" (deploy/run/summary.py): written once, here.
CONTROLLER_SILENT = "no heartbeat from the controller for {seconds} s"
# Of a run's folder on the controller: an attached `fab train`'s copy of every line each host streamed,
# `<host>.log` (deploy/edges/launcher.py writes it; `fab logs` shows it for a host that cannot be reached).
CONTROLLER_LOGS = "logs"

# Files of the checkpoints directory: the only names the trainer writes there.
CHECKPOINT_MANIFEST = "MANIFEST.sha256"  # "<sha256>  <name>" lines, sha256sum format
BEST_CHECKPOINT = "best.pt"
# ASCII digits only: `\d` would also accept other scripts' digits, which int() reads as a step.
_PERIODIC_CHECKPOINT = re.compile(r"ckpt-step([0-9]{9})\.pt", re.ASCII)

# Files of a host directory (`runs/<run_id>/hosts/<host>/`), written by the agent.
AGENT_PIDFILE = "agent.json"
# flock held by the run's one agent on the host for its whole life, its pid written in it: a second agent of the
# run there (a detached join, a resume of a running run) refuses instead of stopping the first one's processes.
AGENT_LOCK = "agent.lock"
AGENT_BUSY_EXIT = 75  # an agent's exit status when another agent of its run holds AGENT_LOCK (EX_TEMPFAIL)
TRAIN_LOG = "train.log"
EXIT_RECORD = "exit.json"
# Membership events as JSON lines: each host's agent in its host directory (started, rejoined, peers
# lost, rendezvous moved, workers restarted, ended); an attached controller in the run directory.
EVENTS = "events.jsonl"
TORCHRUN_LOGS = "torchrun"
EXIT_BARRIER_MARK = "exit-barrier"  # created by torchrun when its workers succeeded (TORCHRUN_EXIT_MARK_ENV)

AGENT_MODULE = "meshrun.deploy.host.agent"
TRAINER_MODULE = "meshrun.train"  # the built-in trainer: launched by the plan, asked by --check and --describe
NOTIFY_CLOSE_S = 10.0  # what a run's last notification may add to its end, at most (controller or detached agent)
SCRIPT_RUNNER_MODULE = "meshrun.deploy.host.runscript"  # runs a user's --script, then leaves with os._exit
# What that runner writes on stderr for a rank of a world > 1 that exited 0 without calling init_process_group
# (deploy/host/alonewatch.py), and the controller reads back from its host logs into summary.json's
# `trained_alone` (deploy/run/alone.py).
ALONE_LINE = ("meshrun: rank {rank} of {world} never called torch.distributed.init_process_group: it trained alone "
              '(docs/scripts.md, "Scripts written for mp.spawn")')
# torchrun as meshrun starts it: the rendezvous state read as data (deploy/host/torchrun.py, which keeps its own
# copies of the three names below: the check ships it to hosts without meshrun; tests/test_rdzv_state.py holds them equal).
TORCHRUN_MODULE = "meshrun.deploy.host.torchrun"
TORCHRUN_RDZV_HOST_FLAG = "--meshrun-rdzv-host"  # its own first option: the rendezvous host's inventory name
STATE_REFUSED_EXIT = 65  # its exit status when the store held a rendezvous state no torchrun of the run wrote
TORCHRUN_EXIT_MARK_ENV = "MESHRUN_EXIT_BARRIER_MARK"  # the file it creates when its workers succeeded (its exit barrier)
# An attached run's torchrun waits this long in its exit barrier, not torch's 300 s, after which torch exits 0
# as if every peer had arrived and the controller stops a peer still saving (deploy/host/torchrun.py).
TORCHRUN_EXIT_TIMEOUT_ENV = "MESHRUN_EXIT_BARRIER_TIMEOUT_S"
ATTACHED_EXIT_BARRIER_S = 24 * 3600  # a bound, not a wait: a peer reported gone ends it (deploy/host/exitbarrier.py)

# The controller's lines to an agent's stdin: any line is a heartbeat; this one also asks the agent
# to restart its worker group (a peer was cut off, see deploy/edges/launcher.py).
AGENT_RESTART_LINE = b"restart\n"
# This one tells it a peer ended without finishing (lost or left): a torchrun of its host waiting
# for that peer in torch's exit barrier is ended at once (deploy/host/exitbarrier.py), not after the
# barrier's bound (ATTACHED_EXIT_BARRIER_S in an attached run, torch's 300 s in a detached one).
AGENT_PEER_GONE_LINE = b"peer-gone\n"
# An attached run's agent to the controller: its host's usage for the idle rule, one JSON object
# after this prefix, on the stream that carries the run's output (deploy/host/idle.py UsageFeed);
# the controller takes these lines out of the log (deploy/edges/launcher.py).
AGENT_USAGE_PREFIX = "meshrun-agent-usage: "

# Timing both sides rely on.
HEARTBEAT_EVERY_S = 2.0  # the controller writes a heartbeat line to each agent (and probes each host) this often
HEARTBEAT_TIMEOUT_S = 30  # an agent stops its run when the controller is silent this long
STOP_GRACE_S = 5.0  # TERM, then this long, then KILL: a stopped run must be gone within seconds, under load too
DEFAULT_PG_TIMEOUT_S = 60  # collective timeout: a cut link is noticed in bounded time
PREFLIGHT_REUSE_S = 300  # a passed pre-flight is reused this long while its key (hosts, their facts stamp) holds
# A GPU with more MiB in use than this before a run starts is held by another process: the pre-flight WARNs
# (deploy/check/gpus.py) and the host stamp lists it (deploy/host/stamp.py keeps a copy: it travels alone).
GPU_BUSY_MIB = 1024


def generation_rdzv_id(launch_rdzv_id: str, generation: int) -> str:
    """The rendezvous id of succession generation `generation` (0: the launch's own id). Each
    rendezvous host in turn gets a fresh id: reusing one would join the dead host's stale state."""
    return launch_rdzv_id if generation == 0 else f"{launch_rdzv_id}-g{generation}"


def launch_rdzv_id(rdzv_id: str) -> str:
    """The launch's own rendezvous id, from any generation's (the inverse of generation_rdzv_id)."""
    base, sep, gen = rdzv_id.rpartition("-g")
    return base if sep and gen.isdigit() and gen.isascii() else rdzv_id


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", re.ASCII)


def is_run_id(text: str) -> bool:
    """A name that can be a run id: one path component, never `..`, no separators or controls."""
    return bool(_RUN_ID.fullmatch(text)) and ".." not in text


def run_dir(run_id: str) -> str:
    """A run's directory, relative to the workdir on a host and to the project locally."""
    return f"{RUNS_DIR}/{run_id}"


def host_dir(run_id: str, host: str) -> str:
    """Where a host's agent keeps its pidfile and log, inside the run directory."""
    return f"{run_dir(run_id)}/{HOSTS}/{host}"


# Every run's agent lock in a workdir, as a glob relative to it: a lock held is a run running from that
# workdir (the host-side test `deploy/host/setup.py --check-only --agent-locks` reads them).
AGENT_LOCKS = f"{host_dir('*', '*')}/{AGENT_LOCK}"


def controller_log(host: str) -> str:
    """The attached controller's copy of `host`'s streamed lines, relative to the run's folder (CONTROLLER_LOGS)."""
    return f"{CONTROLLER_LOGS}/{host}.log"


def log_path(run_id: str, host: str) -> str:
    """The agent's tee of torchrun's output on `host`, relative to its workdir."""
    return f"{host_dir(run_id, host)}/{TRAIN_LOG}"


def rank_metrics(rank: int) -> str:
    """Each rank's own step records in its run dir (RANK_METRICS_GLOB finds them all)."""
    return f"metrics.rank{rank}.jsonl"


class RecordKind(str, enum.Enum):
    """The `kind` of each line of `metrics.jsonl` (the trainer writes them, `fab report` reads them)."""

    CONFIG = "config"
    RESUME = "resume"
    EPOCH = "epoch"
    STEP = "step"
    COMM = "comm"
    BALANCE = "balance"


def checkpoint_name(step: int) -> str:
    """The file name of the periodic checkpoint saved at global step `step`."""
    return f"ckpt-step{step:09d}.pt"


def checkpoint_step(name: str) -> int | None:
    """The step of a periodic checkpoint's file name; None for any other name (`best.pt` too)."""
    found = _PERIODIC_CHECKPOINT.fullmatch(name)
    return int(found.group(1)) if found else None


def is_checkpoint_name(name: str) -> bool:
    """One of the names the trainer writes for a checkpoint (not the manifest)."""
    return name == BEST_CHECKPOINT or checkpoint_step(name) is not None


# The owner mark of a host's workdir: one line, `<project id> <project directory name>`, written by the
# first code sync of a project into it; another project's sync there is refused (deploy/edges/sync.py).
WORKDIR_OWNER = ".meshrun-project"
# Of a host's workdir too: the names the last code sync sent there, one a line (deploy/host/codestat.py `record_of`,
# which keeps a copy of this name: it travels alone). The next sync removes there the names it holds that the project
# no longer ships, and nothing else (deploy/edges/sync.py); the code check trusts a digest only beside it.
SHIPPED_LIST = ".meshrun-files"
# Of a run directory on the controller: flock held by a `fab fetch-checkpoints` of the run for its whole
# fetch, its pid written in it; a second one into the same runs dir refuses (its staging tree is the same).
FETCH_LOCK = ".fetch.lock"
