"""Launch the trainer the way the controller does, and read what it wrote.

Everything runs in real processes, gloo on CPU: the trainer's ranks forked by tests/trainer/forkrun.py
(torch imported once per launch, not once per rank and again by torchrun's agent), or under real
``torchrun`` (``torchrun=True``) for the tests about what torchrun gives; ``torch.multiprocessing``
(forked ranks) for function-level multi-rank tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
FORKRUN = Path(__file__).resolve().with_name("forkrun.py")
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "MESHRUN_RUN_ID",
                  "MESHRUN_BATCH_SIZE", "MESHRUN_SITE")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun_logs(folder: Path) -> list[str]:
    """torchrun's per-attempt folders under the test's own temporary folder: without `--log-dir`
    torchrun makes a `torchelastic_*` folder in /tmp that nothing removes (hundreds per suite run)."""
    return [f"--log-dir={folder / 'torchrun-logs'}"]


def train_argv(run_dir: Path, overrides: tuple[str, ...], nproc: int, config: Path | None,
               torchrun: bool = False) -> list[str]:
    if not nproc:
        launcher = [sys.executable, "-m", "meshrun.train"]
    elif torchrun:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                    *torchrun_logs(run_dir.parent), "-m", "meshrun.train"]
    else:
        launcher = [sys.executable, str(FORKRUN), f"--nproc={nproc}", "--"]
    cfg = ["--config", str(config)] if config else []
    return [*launcher, *cfg, "--run-dir", str(run_dir), *overrides]


def train(run_dir: Path, *overrides: str, nproc: int = 2, config: Path | None = None,
          timeout: float = 600, env: dict[str, str] | None = None,
          torchrun: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python -m meshrun.train`` (``nproc`` ranks forked by forkrun.py, or under torchrun with
    ``torchrun``; one plain process when ``nproc`` is 0) and wait for it; ``env`` adds variables
    (e.g. MESHRUN_BATCH_SIZE, as the controller sets it)."""
    return subprocess.run(train_argv(run_dir, overrides, nproc, config, torchrun), cwd=run_dir.parent,
                          env=clean_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def train_hosts(base: Path, hosts: tuple[tuple[str, int], ...], *overrides: str,
                timeout: float = 600, envs: dict[str, dict[str, str]] | None = None,
                torchrun: bool = False) -> dict[str, subprocess.CompletedProcess[str]]:
    """Simulated hosts on this machine, started as the controller starts real ones, one launcher
    per host: forkrun.py's ranks (or with ``torchrun``, one ``torchrun --nnodes``: a static
    rendezvous on 127.0.0.1), ranks numbered host by host, each host with its own
    ``MESHRUN_HOST`` (plus ``envs[host]``, e.g. MESHRUN_SITE) and run dir ``base/<host>/run``;
    output in ``base/<host>/out|err``."""
    port, procs, world = free_port(), {}, sum(nproc for _, nproc in hosts)
    try:
        for node, (host, nproc) in enumerate(hosts):
            home = base / host
            home.mkdir(parents=True, exist_ok=True)
            first = sum(n for _, n in hosts[:node])
            launcher = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(hosts)}",
                        f"--node-rank={node}", f"--nproc-per-node={nproc}", *torchrun_logs(home),
                        "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "meshrun.train"] if torchrun else \
                [sys.executable, str(FORKRUN), f"--nproc={nproc}", f"--nnodes={len(hosts)}", f"--node-rank={node}",
                 f"--first-rank={first}", f"--world-size={world}", f"--master-port={port}", "--"]
            argv = [*launcher, "--run-dir", str(home / "run"), *overrides]
            # Files, not pipes: a full pipe would stall one host, and with it the collectives.
            with open(home / "out", "w") as out, open(home / "err", "w") as err:
                procs[host] = subprocess.Popen(argv, cwd=home, env=clean_env(MESHRUN_HOST=host, **(envs or {}).get(host, {})),
                                               stdout=out, stderr=err, text=True)
        codes = {host: proc.wait(timeout=timeout) for host, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {host: subprocess.CompletedProcess(procs[host].args, code, (base / host / "out")
                                              .read_text(), (base / host / "err").read_text())
            for host, code in codes.items()}


def records(run_dir: Path, name: str = "metrics.jsonl", kind: str | None = None) -> list[dict[str, Any]]:
    lines = (run_dir / name).read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fork_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` processes forked from this one;
    ``fn`` must create its own gloo group on ``tcp://127.0.0.1:<port>`` and write results to files.

    Forked, not spawned: a spawned process imports torch again, and its first optimizer imports
    torch._dynamo (torch 2.14), about 9 s of CPU per rank on the 2-core CI machine for tests whose
    own work takes milliseconds. The ranks are still separate processes with their own gloo
    group; each runs one intra-op thread, as the trainer's ranks do under OMP_NUM_THREADS=1."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_run_then_exit, args=(fn, world_size, free_port(), *args),
                       nprocs=world_size, start_method="fork")


def _run_then_exit(rank: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn`` and leave without interpreter finalization: torch 2.14 + gloo sometimes aborts
    there ("terminate called without an active exception") after a clean
    ``destroy_process_group()``, which would fail a test whose ranks all did their work. An
    exception from ``fn`` still propagates, so a real failure is still reported."""
    import torch

    torch.set_num_threads(1)  # a pool inherited across fork is not safe to use; one thread needs none
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
