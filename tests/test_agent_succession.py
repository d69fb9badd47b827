"""A real agent's succession decision, without the cluster: a listener stands for the rendezvous
host's c10d store and small python programs for torchrun and its workers (torchrun itself would
add 10 s of `import torch` and nothing to the decision, which reads only the store and the
processes). End of a run: the store goes away while no worker runs here, and torchrun then ends
by itself with status 0: no succession (CI saw a finished run moved to a new rendezvous that
waited 130 s for nobody). Mid-run: a worker still runs when the store goes: succession at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.harness import REPO

HOST = "h2"
# torchrun's stand-in: optionally a worker (a child that sleeps), then wait for `go` and end with 0.
TORCHRUN = """
import os, subprocess, sys, time
worker = subprocess.Popen(["sleep", "600"]) if sys.argv[1] == "worker" else None
while not os.path.exists("go"):
    time.sleep(0.1)
sys.exit(0)
"""
WAITING = "does not answer and no worker runs here"


def _run_id(mode: str) -> str:
    return f"r-succession-{mode}"  # tagged processes are found by run id: one per case


def _start_agent(tmp_path: Path, store_port: int, mode: str) -> subprocess.Popen:
    generations = [
        {"head": "h1", "endpoint": f"127.0.0.1:{store_port}", "torchrun": [sys.executable, "-c", TORCHRUN, mode]},
        {"head": HOST, "endpoint": "127.0.0.1:1", "torchrun": ["sh", "-c", "echo moved > moved.txt"]},
    ]
    return subprocess.Popen([sys.executable, "-m", "meshrun.deploy.host.agent", "run", "--run-id", _run_id(mode),
                             "--host", HOST, "--heartbeat-timeout", "0", "--quiet", "--succession",
                             json.dumps(generations), "--", "true"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["ended", "worker"])
def test_a_store_gone_at_the_end_of_a_run_moves_nothing_but_in_mid_run_it_moves(tmp_path: Path, mode: str) -> None:
    store = socket.create_server(("127.0.0.1", 0))
    port = store.getsockname()[1]
    agent = _start_agent(tmp_path, port, mode)
    host_dir = tmp_path / "runs" / _run_id(mode) / "hosts" / HOST
    log = host_dir / "train.log"
    try:
        # The watcher has seen the store up once its probe connects (a store never seen up gets a
        # 90 s start-up grace instead). Not a fixed sleep: a loaded CI machine once started the
        # agent more than 3 s late, and the store was gone before its first probe.
        store.settimeout(60)
        probe, _ = store.accept()
        probe.close()
        store.close()
        if mode == "ended":
            _wait_for(lambda: log.exists() and WAITING in log.read_text(), "the agent never saw the store gone")
            assert not (tmp_path / "moved.txt").exists()
            (tmp_path / "go").touch()
        assert agent.wait(timeout=60) == 0
    finally:
        agent.kill()
        agent.wait()
    events = [json.loads(line)["event"] for line in (host_dir / "events.jsonl").read_text().splitlines()]
    record = json.loads((host_dir / "exit.json").read_text())
    if mode == "ended":
        assert (events, record["rc"], record["generation"]) == (["started", "ended"], 0, 0)
        assert not (tmp_path / "moved.txt").exists()
    else:
        assert (events, record["rc"], record["generation"]) == (["started", "rendezvous_moved", "ended"], 0, 1)
        assert (tmp_path / "moved.txt").read_text() == "moved\n"
        assert WAITING not in log.read_text()
