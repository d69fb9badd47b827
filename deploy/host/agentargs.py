"""The agent's command line (`python -m meshrun.deploy.host.agent run|stop|status ...`), as the
controller builds it (deploy/run/plan.py `agent_argv`), and the inventory's `env` it reads from
stdin (`--env-stdin`). Standard library only: it runs on hosts."""

from __future__ import annotations

import argparse
import io
import json
import os

from meshrun.events import NOTIFY_KEY
from meshrun.layout import (AGENT_MODULE, ATTACHED_EXIT_BARRIER_S, ENV_HOST, ENV_RUN_DIR, ENV_RUN_ID, HEARTBEAT_TIMEOUT_S,
                            SCRIPT_RUNNER_MODULE, STOP_GRACE_S, TORCHRUN_EXIT_MARK_ENV, TORCHRUN_EXIT_TIMEOUT_ENV,
                            TRAINER_MODULE, run_dir)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {AGENT_MODULE}")
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run")
    run.add_argument("--run-id", required=True)
    run.add_argument("--host", required=True)
    run.add_argument("--heartbeat-timeout", type=float, default=float(HEARTBEAT_TIMEOUT_S))
    run.add_argument("--grace", type=float, default=STOP_GRACE_S)
    run.add_argument("--env", action="append", default=[], help="KEY=VALUE, meshrun's own variables (not secret)")
    run.add_argument("--env-stdin", action="store_true",
                     help="the first line of stdin is a JSON object of more variables (the inventory's env)")
    run.add_argument("--detach", action="store_true")
    run.add_argument("--run-dir", default="", help="the ranks' MESHRUN_RUN_DIR, relative to the workdir (default "
                     "runs/<id>): a --script run's own folder where the workdir is the controller's project")
    run.add_argument("--succession", default="", help="JSON: the rendezvous generations (elastic runs)")
    run.add_argument("--generation", type=int, default=0, help="start at this generation of the succession")
    run.add_argument("--peers", default="", help="JSON {host: address:port}: detached elastic runs restart "
                                                 "their workers when a peer host stops answering")
    run.add_argument("--idle", default="", help="JSON {threshold, warn_s, stop_s}: a detached run's idle rule "
                     "(deploy/host/idle.py)")
    run.add_argument("--usage-every", type=float, default=0.0,
                     help="an attached run: send this host's usage to the controller this often, in seconds")
    run.add_argument("--quiet", action="store_true")
    run.add_argument("command", nargs=argparse.REMAINDER)
    for verb in ("stop", "status"):
        p = sub.add_parser(verb)
        p.add_argument("--host", required=True)
        p.add_argument("--run-id", required=verb == "stop")
        p.add_argument("--grace", type=float, default=STOP_GRACE_S)
    args = parser.parse_args(argv)
    if args.verb == "run":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            parser.error("run needs a command after --")
    return args


def runs_trainer(command: list[str]) -> bool:
    """Whether the run's command (torchrun's argv, deploy/run/plan.py `_workload_argv`) starts the built-in
    trainer rather than a --script: the first `-m` that names either decides, so a script's own arguments
    (after the runner's `-m`) cannot pass for the trainer. Anything else is not the trainer."""
    for flag, module in zip(command, command[1:]):
        if flag == "-m" and module in (TRAINER_MODULE, SCRIPT_RUNNER_MODULE):
            return module == TRAINER_MODULE
    return False


def detached_argv(args: argparse.Namespace, python: str) -> list[str]:
    """`run --detach`'s own copy of the agent: the same run with no controller (no heartbeat, quiet),
    its variables from stdin as they came (`--env-stdin`)."""
    argv = [python, "-m", AGENT_MODULE, "run", "--run-id", args.run_id, "--host", args.host,
            "--heartbeat-timeout", "0", "--grace", str(args.grace), "--quiet"]
    for kv in args.env:
        argv += ["--env", kv]
    if args.run_dir:
        argv += ["--run-dir", args.run_dir]
    if args.succession:
        argv += ["--succession", args.succession, "--generation", str(args.generation)]
    if args.peers:
        argv += ["--peers", args.peers]
    if args.idle:
        argv += ["--idle", args.idle]
    return argv + ["--env-stdin", "--", *args.command]


ENV_BLOCK_MAX = 1 << 20  # the inventory itself is capped at 1 MiB


def read_env_block(stream: io.BufferedIOBase) -> dict[str, str]:
    """The first stdin line (`--env-stdin`): the inventory's `env` as a JSON object of strings.
    Read before the heartbeat thread starts, so no heartbeat is mistaken for it."""
    line = stream.readline(ENV_BLOCK_MAX)
    try:
        block = json.loads(line)
    except ValueError:
        block = None
    if not isinstance(block, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in block.items()):
        raise SystemExit("meshrun-agent: --env-stdin: the first line of stdin is not a JSON object of strings")
    return block


def ranks_run_dir(args: argparse.Namespace) -> str:
    """`MESHRUN_RUN_DIR`, absolute (the agent runs in the workdir): where a script writes what comes home.
    `runs/<id>`, unless the controller named a folder of the script's own (`--run-dir`: the workdir is
    its project, whose `runs/<id>/` holds the controller's records; deploy/run/plan.py `script_run_dir`)."""
    # parse() always sets run_dir; a Namespace built by hand (a test's) may lack it.
    return os.path.abspath(getattr(args, "run_dir", "") or run_dir(args.run_id))


def run_env(args: argparse.Namespace, exit_mark: str) -> tuple[dict[str, str], str | None]:
    """torchrun's environment, and a detached run's notification receivers (taken out: never in
    the env). The inventory's `env` came on stdin, never argv; our own tags are set last, since
    the sweep in `stop` relies on them."""
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    spec = args.secret_env.pop(NOTIFY_KEY, None)
    env.update(args.secret_env)
    env.update({ENV_RUN_ID: args.run_id, ENV_HOST: args.host, ENV_RUN_DIR: ranks_run_dir(args),
                TORCHRUN_EXIT_MARK_ENV: exit_mark})
    env.pop(TORCHRUN_EXIT_TIMEOUT_ENV, None)
    if getattr(args, "heartbeat_timeout", 0) > 0:  # a controller watches: it stops a peer that looks finished too early
        env[TORCHRUN_EXIT_TIMEOUT_ENV] = str(ATTACHED_EXIT_BARRIER_S)  # detached: torch's 300 s harm no peer
    return env, spec
