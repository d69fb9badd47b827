"""Multi-host runs end to end on the simulated cluster: real sshd, namespaces, rsync, torchrun.

Each test starts torch on 3 hosts (15-40 s of CPU), so assertions that can share a run do.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest

from meshrun.train.safe_load import load_file
from tests.cpuhog import cpu_hog
from tests.fabrun import (ROOT, FabProcess, fab, run_id_of, run_processes, torchrun_envs,
                          wait_no_run_processes)
from tests.runrecords import summary_of

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# Every test but the WireGuard one (slot 0's overlay addresses) runs on any slot's cluster.
EITHER = pytest.mark.either_cluster

HOSTILE = ["a b", "it's", 'say "hi"', "$(touch /tmp/meshrun-pwned)", "`touch /tmp/meshrun-pwned`",
           "x; touch /tmp/meshrun-pwned", "line1\nline2", "$HOME", "*", "\\", "--epochs", "-rf", "é ü 漢"]
PWNED = Path("/tmp/meshrun-pwned")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@EITHER
def test_three_hosts_train_fetch_and_verify_checkpoints(testbed, inventory: Path, tmp_path: Path) -> None:
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # what this controller last synced where: its own
    done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2,h3", "--", "epochs=10", timeout=300, env=cache)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run_id = run_id_of(done.stdout)
    summary = summary_of(run_id)
    assert summary["status"] == "succeeded" and summary["hosts"] == ["h1", "h2", "h3"]
    assert summary["world_size"] == 3 and summary["metrics"]["test_acc"] >= 0.95
    for rank, host in enumerate(["h1", "h2", "h3"]):
        assert f"[{host}:{rank}] " in done.stdout  # live, prefixed by host and global rank
        assert (ROOT / "runs" / run_id / "logs" / f"{host}.log").read_text()
        # Synced code really landed in each host's private home.
        assert testbed.exec(int(host[1]), ["test", "-f", "/root/meshrun/deploy/host/agent.py"], check=False).returncode == 0
    assert not run_processes(run_id)

    manifest, newest = assert_one_holders_copy_comes_home(run_id)
    assert_a_damaged_copy_is_not_kept(testbed, run_id, newest, manifest)
    assert_every_copy_brings_each_hosts(run_id, newest, manifest)

    # The hosts lose every copy; `fab train --resume` pushes the fetched, verified checkpoints to the
    # rendezvous host with the controller's manifest, and the run continues from that step.
    for i in (1, 2, 3):
        testbed.exec(i, ["rm", "-rf", f"/root/meshrun/runs/{run_id}/checkpoints"])
    # The code is unchanged here, and on h1 and h3 (deploy/run/codehint.py); h2's copy of a file
    # was edited there: h2 alone is synced, and gets the project's file back.
    testbed.exec(2, ["sh", "-c", "echo edited on h2 >> /root/meshrun/README.md"])
    resumed = fab("train", "--resume", run_id, "--skip-checks", "--", "epochs=12", timeout=300, env=cache)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert "sync: the code on 2 of 3 host(s) was already this project's" in resumed.stdout
    assert testbed.exec(2, ["cat", "/root/meshrun/README.md"]).stdout == (ROOT / "README.md").read_text()
    step = int(newest[len("ckpt-step"):-len(".pt")])
    assert f"resume: pushed checkpoints up to step {step} to h1" in resumed.stdout
    assert summary_of(run_id)["epochs_completed"] == 12
    lines = testbed.exec(1, ["cat", f"/root/meshrun/runs/{run_id}/metrics.jsonl"]).stdout.splitlines()
    resumes = [r for r in map(json.loads, lines) if r.get("kind") == "resume"]
    assert resumes and resumes[-1]["from_step"] == step


def assert_one_holders_copy_comes_home(run_id: str) -> tuple[dict[str, str], str]:
    """The fetch: verified checkpoints assembled, h1's copy of them home (every host wrote a
    complete, byte-identical one: one crossed the link, the others' manifests and logs only)."""
    fetched = fab("fetch-checkpoints", "--run", run_id)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    home = ROOT / "runs" / run_id
    manifest = dict(reversed(line.split("  ")) for line in (home / "checkpoints/MANIFEST.sha256").read_text().splitlines())
    newest = sorted(n for n in manifest if n.startswith("ckpt-step"))[-1]
    assert sha256(home / "checkpoints" / newest) == manifest[newest]
    state = load_file(home / "checkpoints" / newest)  # weights_only: runs no code
    assert state["world_size"] == 3 and "model" in state
    assert sha256(home / "hosts/h1/checkpoints" / newest) == manifest[newest]
    assert "checkpoints: taken from h1 (the hosts hold the same copy" in fetched.stdout
    for host in ("h2", "h3"):
        assert sorted(p.name for p in (home / "hosts" / host / "checkpoints").iterdir()) == ["MANIFEST.sha256"]
    assert (home / "hosts/h2").is_dir() and (home / "hosts/h1/metrics.jsonl").exists()
    assert "fab train --resume" in fetched.stdout
    return manifest, newest


def assert_a_damaged_copy_is_not_kept(testbed, run_id: str, newest: str, manifest: dict[str, str]) -> None:
    """A damaged copy on the host whose checkpoints the fetch takes (h1: most of them are home
    already) is caught and not kept, and the next holder's verified copy is taken; a differing
    local file is not overwritten."""
    home = ROOT / "runs" / run_id
    (home / "checkpoints" / newest).unlink()
    (home / "hosts/h1/checkpoints" / newest).unlink()
    remote = f"/root/meshrun/runs/{run_id}/checkpoints/{newest}"
    testbed.exec(1, ["python3", "-c", f"f=open('{remote}','r+b'); f.seek(100); f.write(b'XXXX')"])
    (home / "hosts/h2/metrics.rank1.jsonl").write_text("edited locally\n")
    again = fab("fetch-checkpoints", "--run", run_id)
    assert again.returncode == 1
    assert f"checksum mismatch, not kept: h1:checkpoints/{newest}" in again.stderr
    assert not (home / "hosts/h1/checkpoints" / newest).exists()
    assert sha256(home / "checkpoints" / newest) == manifest[newest]  # h2's copy
    assert "checkpoints: taken from h1, h2 (" in again.stdout
    assert (home / "hosts/h2/metrics.rank1.jsonl").read_text() == "edited locally\n"
    assert "metrics.rank1.jsonl" in again.stdout  # listed as not overwritten


def assert_every_copy_brings_each_hosts(run_id: str, newest: str, manifest: dict[str, str]) -> None:
    """--every-copy: each host's checkpoints, h1's damaged one named and not kept."""
    home = ROOT / "runs" / run_id
    every = fab("fetch-checkpoints", "--run", run_id, "--every-copy")
    assert every.returncode == 1 and f"checksum mismatch, not kept: h1:checkpoints/{newest}" in every.stderr
    for host in ("h2", "h3"):
        assert sha256(home / "hosts" / host / "checkpoints" / newest) == manifest[newest]


def test_uneven_processes_over_the_wireguard_overlay(testbed_wg, make_inventory) -> None:
    """2+1+1 processes; rendezvous on h1's overlay address; NCCL/GLOO interface is wg0 (read from each
    host's live torchrun: the agent records no environment, it may hold secrets)."""
    inventory = make_inventory(host_overrides={"h1": {"nproc": 2}})
    text = inventory.read_text()
    assert "10.78.0.11" in text and "network: wireguard" in text
    run = FabProcess("train", "--inventory", str(inventory), "--", "epochs=8")
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 1 ", timeout=300))
        envs = torchrun_envs(run_id)
        assert run.finish(timeout=420) == 0, run.output[-3000:]
    finally:
        run.close()
    summary = summary_of(run_id)
    assert summary["world_size"] == 4 and summary["metrics"]["test_acc"] >= 0.95
    assert sorted(envs) == ["h1", "h2", "h3"]
    for i in (1, 2, 3):
        env = envs[f"h{i}"]
        assert env["GLOO_SOCKET_IFNAME"] == "wg0" and env["NCCL_SOCKET_IFNAME"] == "=wg0"
        assert env["NCCL_IB_DISABLE"] == "1"
        agent = json.loads(testbed_wg.exec(i, ["cat", f"/root/meshrun/runs/{run_id}/hosts/h{i}/agent.json"]).stdout)
        command = agent["command"]
        assert command[command.index("--rdzv-endpoint") + 1] == "10.78.0.11:29400"
        assert command[command.index("--local-addr") + 1] == f"10.78.0.1{i}"
        assert command[command.index("--nproc-per-node") + 1] == ("2" if i == 1 else "1")


@EITHER
def test_user_script_gets_hostile_arguments_and_env_literally(testbed, make_inventory) -> None:
    """A seed-000-style script runs unmodified via --script; hostile values in argv, env and the
    workdir reach the remote process literally and none is executed."""
    PWNED.unlink(missing_ok=True)
    env = {f"MR_HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}
    inventory = make_inventory(defaults_overrides={"env": env, "workdir": "~/mesh run $(x)"})
    done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--script",
               "docs/examples/seed000_main.py", "--", "--epochs", "1", "--", *HOSTILE, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    line = next(l for l in done.stdout.splitlines() if "ARGS " in l)
    assert json.loads(line.split("ARGS ", 1)[1]) == {"argv": HOSTILE, "epochs": 1}
    assert "rank 1 local_rank 0 epoch 0" in done.stdout
    run_id = run_id_of(done.stdout)
    # The env reached the worker literally (a second, tiny script prints what it received) ...
    echoed = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--skip-checks", "--no-sync",
                 "--script", "tests/scripts/env_echo.py", "--", "MR_HOSTILE_", timeout=300)
    assert echoed.returncode == 0, echoed.stdout[-3000:] + echoed.stderr[-2000:]
    shown = [l.split("ENV ", 1)[1] for l in echoed.stdout.splitlines() if "ENV " in l]
    assert len(shown) == 2 and all(json.loads(s) == env for s in shown)
    # The seed script joined its world; the echo never calls init_process_group: both ranks trained alone,
    # read from the controller's copies of h1's and h2's logs (deploy/run/alone.py).
    assert summary_of(run_id)["trained_alone"] == []
    assert summary_of(run_id_of(echoed.stdout))["trained_alone"] == [{"host": "h1", "rank": 0, "world_size": 2},
                                                                    {"host": "h2", "rank": 1, "world_size": 2}]
    assert "2 rank(s) never called torch.distributed.init_process_group and trained alone (h1 rank 0, h2 rank 1)" in (
        " ".join(echoed.stderr.split()))
    # ... and is kept nowhere on disk: the agent's record holds no environment.
    agent = testbed.exec(2, ["cat", f"/root/mesh run $(x)/runs/{run_id}/hosts/h2/agent.json"]).stdout
    assert "MR_HOSTILE_" not in agent
    assert not PWNED.exists()
    for i in (1, 2, 3):
        assert testbed.exec(i, ["test", "-e", str(PWNED)], check=False).returncode != 0


def leftovers(testbed, run_id: str) -> list:
    """Run processes anywhere: tagged torchrun/workers, or a host agent of this run."""
    agents = [(i, p.pid) for i in (1, 2, 3) for p in testbed.processes(i, sessions=False)
              if "meshrun.deploy.host.agent" in p.argv and run_id in p.argv and "run" in p.argv]
    return run_processes(run_id) + agents


def wait_until_clean(testbed, run_id: str, limit: float) -> float:
    deadline = time.monotonic() + limit
    while leftovers(testbed, run_id):
        assert time.monotonic() < deadline, f"left after {limit} s: {leftovers(testbed, run_id)}"
        time.sleep(0.25)
    return time.monotonic()


@EITHER
@pytest.mark.parametrize("sig,limit", [(signal.SIGINT, 15.0), (signal.SIGKILL, 30.0)], ids=["ctrl-c", "sigkill"])
def test_no_orphans_when_the_controller_is_interrupted_or_killed(testbed, inventory: Path, sig: int,
                                                                 limit: float) -> None:
    run = FabProcess("train", "--inventory", str(inventory), "--", "epochs=500")
    try:
        run_id = run_id_of(run.wait_for(r"\[h1:0\] epoch 1 ", timeout=180))
        assert len({pid for pid in run_processes(run_id)}) >= 6  # torchrun + a worker on each host
        with cpu_hog():  # the bound must hold on a loaded machine
            started = time.monotonic()
            if sig == signal.SIGINT:
                run.signal_group(signal.SIGINT)
            else:
                run.proc.kill()
            took = wait_until_clean(testbed, run_id, limit) - started
        if sig == signal.SIGINT:
            assert run.finish(timeout=60) == 130  # 128 + SIGINT, as any task
            assert summary_of(run_id)["status"] == "stopped"
            assert "every host is clean" in run.output
        print(f"{signal.Signals(sig).name}: run processes gone after {took:.1f} s")
    finally:
        run.close()


@EITHER
def test_crash_on_one_host_stops_the_others_and_shows_its_tail(testbed, inventory: Path) -> None:
    done = fab("train", "--inventory", str(inventory), "--script", "tests/scripts/crash_one_rank.py", timeout=240)
    assert done.returncode == 1
    run_id = run_id_of(done.stdout)
    tail = done.stderr.split("lines from h3's ranks ---", 1)[1]
    assert "[h3:2] CRASHING on purpose" in tail and "exitcode  : 7" in tail
    assert f"runs/{run_id}/hosts/h3/train.log" in done.stderr
    summary = summary_of(run_id)
    assert summary["status"] == "failed" and summary["failed_host"] == "h3"
    assert all(not r["remaining_pids"] for r in summary["host_results"].values())
    wait_no_run_processes(run_id, timeout=5)


@EITHER
def test_preflight_stops_a_run_on_a_host_without_torch(testbed, make_inventory) -> None:
    """The fast pre-flight (versions, ports) runs before sync and launch; --skip-checks skips it."""
    inventory = make_inventory(host_overrides={"h2": {"python": "/usr/bin/python3"}})
    done = fab("train", "--inventory", str(inventory), "--", "epochs=1", timeout=120)
    assert done.returncode == 1
    assert "error: pre-flight failed: h2: " in done.stderr and "torch" in done.stderr
    assert "fab check-network" in done.stderr
    assert "run " not in done.stdout  # nothing was launched
