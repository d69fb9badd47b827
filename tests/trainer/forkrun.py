"""The trainer tests' launcher: torch, torch._dynamo and the trainer imported once, then one process
per rank forked from here with the variables torchrun gives its workers.

Why: a rank that torchrun starts is a new interpreter: `import torch` (about 3.5 CPU-s on the 2-core
CI machine) and, at its first optimizer step, `torch._dynamo` (about 2.2 more), and torchrun's own
agent imports torch too. A 2-rank trainer test paid about 15 CPU-s before its first step; forked
from here it pays about 6, once. The trainer tests run some sixty such launches (tests/run).

What stays real: every rank is its own process with its own gloo group over TCP on 127.0.0.1 (env://,
rank 0 holding the store, as `init_process_group` does without torchrun's agent), and runs
`python -m meshrun.train` from its first line. What torchrun adds and these tests do not look at
(its agent's store, restarts, its log folders) is left out; what it does on a failure is kept: when
a rank exits non-zero the others are stopped (SIGTERM, then SIGKILL after STOP_GRACE_S) and the
launch exits 1, as torchrun reports any failed child. Tests about what torchrun gives its workers
(restart counts, elastic membership) and every test of the controller start the trainer under real
torchrun (`tests/trainer/harness.py`, `torchrun=True`; tests/fabrun.py).

    python forkrun.py --nproc N [--nnodes K --node-rank I --first-rank R --world-size W
                      --master-port P] -- ARGS...   (ARGS: those of `python -m meshrun.train`)
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
import uuid

from harness import free_port  # this file's folder is first on sys.path: it runs as a script

from meshrun.deploy.host.procs import die_with_parent

STOP_GRACE_S = 30.0  # torchrun's own wait before it kills a worker that ignored SIGTERM


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="forkrun")
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--first-rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=0)  # 0: nproc (one node)
    parser.add_argument("--master-port", type=int, default=0)  # 0: a free one (one node)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def rank_env(args: argparse.Namespace, local_rank: int, port: int, run_id: str) -> dict[str, str]:
    """What torchrun sets for a worker (torch/distributed/elastic/agent/server/local_elastic_agent.py)."""
    world = args.world_size or args.nproc
    rank = args.first_rank + local_rank
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(args.node_rank),
            "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(args.nproc),
            "WORLD_SIZE": str(world), "ROLE_WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(args.nnodes),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id}


def preload() -> None:
    """What every rank would import on its own: done here once, inherited by the forks."""
    import importlib

    import torch

    # torch._dynamo: a first optimizer step imports it (torch 2.14). The trainer's __main__ is run
    # again in each rank (runpy), its other modules are not.
    for name in ("torch._dynamo", "meshrun.train.__main__", "meshrun.train.loop", "meshrun.train.trainer"):
        importlib.import_module(name)
    torch.set_num_threads(1)  # the ranks' OMP_NUM_THREADS=1; no pool is made before the fork


def fork_ranks(args: argparse.Namespace) -> dict[int, int] | None:
    """pid -> local rank in the parent; None in a child (its environment set, to run the trainer)."""
    port = args.master_port or free_port()
    # torchrun --standalone names each launch afresh; a static rendezvous (several nodes) is "none".
    run_id = str(uuid.uuid4()) if args.nnodes == 1 else "none"
    in_child, children = die_with_parent(os.getpid()), {}  # a killed launcher leaves no rank behind
    for local_rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:
            if in_child is not None:
                in_child()
            os.environ.update(rank_env(args, local_rank, port, run_id))
            return None
        children[pid] = local_rank
    return children


def supervise(children: dict[int, int]) -> int:
    """Wait for every rank; the first to fail has the others stopped. 0 when all exit 0, else 1."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: _signal_all(children, signum))
    failed = False
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        del children[pid]
        if os.waitstatus_to_exitcode(status) != 0 and not failed:
            failed = True
            _stop(children)
    return 1 if failed else 0


def _stop(children: dict[int, int]) -> None:
    _signal_all(children, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.05)
    _signal_all(children, signal.SIGKILL)


def _signal_all(children: dict[int, int], signum: int) -> None:
    for pid in list(children):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main() -> None:
    args, trainer_args = parse(sys.argv[1:])
    preload()
    children = fork_ranks(args)
    if children is not None:
        sys.exit(supervise(children))
    sys.argv = ["meshrun.train", *trainer_args]
    runpy.run_module("meshrun.train", run_name="__main__", alter_sys=True)  # ends in os._exit


if __name__ == "__main__":
    main()
