"""Secrets never leak (issue 12, hole 4), on the simulated cluster with real sshd, agents,
torchrun and rsync. The inventory's `env` value reaches the workers' environment, and no
command line on any host or on the controller (every /proc/*/cmdline of this machine, which
holds the hosts' processes too: the test bed's namespaces share the PID namespace), no file the
controller fetches, and no file left on the hosts holds it. `fab sync` leaves inventories and
key files home.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.fabrun import ROOT, fab, run_id_of

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]

WORKDIR = "/root/meshrun"  # the testbed inventory's ~/meshrun
# Values a shell would act on, and a newline: they must arrive as written.
HOSTILE = ["a b", "it's", 'say "hi"', "$(touch /tmp/meshrun-pwned)", "x; touch /tmp/meshrun-pwned", "line1\nline2",
           "$HOME", "*", "\\", "é ü 漢"]


class CmdlineWatch:
    """Reads every process's argv on this machine, over and over, until stopped; keeps any that
    holds `secret`. Catches short-lived commands too (a `sh -c`, the check's `timeout`)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.hits: list[str] = []
        self.scans = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.done.is_set():
            for entry in os.listdir("/proc"):
                try:
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
                except OSError:
                    continue
                if self.secret in argv:
                    shown = argv.replace(b"\0", b" ")[:300]
                    self.hits.append(f"pid {entry}: {shown!r}")
            self.scans += 1
            time.sleep(0.02)

    def __enter__(self) -> CmdlineWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def new_secret() -> str:
    return f"s3cr3t-{secrets.token_hex(12)}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def files_holding(top: Path, secret: str) -> list[str]:
    return [str(p) for p in top.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def host_files_holding(testbed, i: int, run_id: str, secret: str) -> str:
    return testbed.exec(i, ["grep", "-rl", "--", secret, f"{WORKDIR}/runs/{run_id}"], check=False).stdout


def test_attached_run_gives_workers_the_secret_and_nothing_else(testbed, make_inventory) -> None:
    secret = new_secret()
    env = {"MR_TOKEN": secret, **{f"MR_HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}}
    inventory = make_inventory(defaults_overrides={"env": env})
    with CmdlineWatch(secret) as watch:
        done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--script",
                   "tests/scripts/secret_env.py", "--", "4", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert watch.hits == [] and watch.scans > 20
    every = json.dumps(env, sort_keys=True)  # newlines, quotes, `$(...)`: each arrived literally
    for rank in (0, 1):  # each host's worker had it in its environment
        assert f"TOKEN_SHA256 rank {rank} {digest(secret)}" in done.stdout
        assert f"ENV_SHA256 rank {rank} {digest(every)}" in done.stdout
    run_id = run_id_of(done.stdout)
    fetched = fab("fetch-checkpoints", "--run", run_id, timeout=120)
    home = ROOT / "runs" / run_id
    assert len(list(home.rglob("agent.json"))) == 2, fetched.stdout + fetched.stderr  # fetched home
    assert files_holding(home, secret) == []
    for i in (1, 2):
        assert host_files_holding(testbed, i, run_id, secret) == ""


def test_detached_run_and_its_re_exec_keep_the_secret_off_argv(testbed, make_inventory) -> None:
    secret = new_secret()
    inventory = make_inventory(defaults_overrides={"env": {"MR_TOKEN": secret}})
    with CmdlineWatch(secret) as watch:
        done = fab("train", "--inventory", str(inventory), "--hosts", "h1,h2", "--detach", "--script",
                   "tests/scripts/secret_env.py", "--", "3", timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        run_id = run_id_of(done.stdout)
        deadline = time.monotonic() + 120
        exits = [f"{WORKDIR}/runs/{run_id}/hosts/h{i}/exit.json" for i in (1, 2)]
        while not all(testbed.exec(i, ["test", "-e", e], check=False).returncode == 0
                      for i, e in zip((1, 2), exits)):
            assert time.monotonic() < deadline, "the detached run did not end"
            time.sleep(0.5)
    assert watch.hits == [] and watch.scans > 20
    logs = "".join(testbed.exec(i, ["cat", f"{WORKDIR}/runs/{run_id}/hosts/h{i}/train.log"]).stdout for i in (1, 2))
    for rank in (0, 1):
        assert f"TOKEN_SHA256 rank {rank} {digest(secret)}" in logs
    for i in (1, 2):
        assert host_files_holding(testbed, i, run_id, secret) == ""


def test_check_network_all_reduce_keeps_the_secret_off_argv(testbed, make_inventory) -> None:
    secret = new_secret()
    inventory = make_inventory(defaults_overrides={"env": {"MR_TOKEN": secret}})
    with CmdlineWatch(secret) as watch:
        done = fab("check-network", "--inventory", str(inventory), "--hosts", "h1,h2", timeout=300)
    assert "gloo all-reduce under torchrun" in done.stdout and ": ok in " in done.stdout, done.stdout[-3000:]
    assert watch.hits == [] and watch.scans > 20


def test_sync_leaves_inventories_and_key_files_home(testbed) -> None:
    tag = secrets.token_hex(4)
    planted = {f"inventory/mine-{tag}.yaml": "hosts: {}\n", "known_hosts": "x ssh-ed25519 AAAA\n",
               f"keys-{tag}/id_ed25519": "PRIVATE\n", f"keys-{tag}/id_ed25519.pub": "PUBLIC\n",
               f"keys-{tag}/tls.pem": "PEM\n", f"shipped-{tag}.txt": "a plain file ships\n"}
    inventory = testbed.write_inventory(ROOT / f"conf-{tag}" / "cluster.yaml")  # in use, inside the project
    if (ROOT / "known_hosts").exists():  # never clobber one: plant only what we remove after
        del planted["known_hosts"]
    testbed.exec(1, ["rm", "-rf", *(f"{WORKDIR}/{n}" for n in planted)], check=False)
    for name, text in planted.items():
        (ROOT / name).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / name).write_text(text)
    try:
        done = fab("sync", "--inventory", str(inventory), "--hosts", "h1", timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        names = [*planted, f"conf-{tag}/cluster.yaml", f"conf-{tag}/cluster_known_hosts",
                 "inventory/lan.example.yaml"]
        script = 'cd "$1" && shift && for f in "$@"; do if [ -e "$f" ]; then echo "$f"; fi; done'
        present = testbed.exec(1, ["sh", "-c", script, "sh", WORKDIR, *names]).stdout.split()
        assert sorted(present) == sorted([f"shipped-{tag}.txt", "inventory/lan.example.yaml"])

        # A git clone inside the project ships file by file through its own git: its code, never its keys.
        nested = ROOT / f"nested-{tag}"
        for name, text in (("pkg/mod.py", "X = 1\n"), ("id_ed25519", "PRIVATE\n"), ("known_hosts", "x ssh-ed25519 A\n")):
            (nested / name).parent.mkdir(parents=True, exist_ok=True)
            (nested / name).write_text(text)
        subprocess.run(["git", "init", "-q", str(nested)], check=True)
        # A file that left the project (deleted here) is removed there by the next sync.
        (ROOT / f"shipped-{tag}.txt").unlink()
        again = fab("sync", "--inventory", str(inventory), "--hosts", "h1", timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
        names = [f"shipped-{tag}.txt", f"nested-{tag}/pkg/mod.py", f"nested-{tag}/id_ed25519",
                 f"nested-{tag}/known_hosts", "inventory/lan.example.yaml"]
        present = testbed.exec(1, ["sh", "-c", script, "sh", WORKDIR, *names]).stdout.split()
        assert sorted(present) == sorted([f"nested-{tag}/pkg/mod.py", "inventory/lan.example.yaml"])
    finally:
        shutil.rmtree(ROOT / f"nested-{tag}", ignore_errors=True)
        for name in [*planted, f"conf-{tag}/cluster.yaml", f"conf-{tag}/cluster_known_hosts"]:
            (ROOT / name).unlink(missing_ok=True)
        testbed.exec(1, ["rm", "-rf", f"{WORKDIR}/shipped-{tag}.txt", f"{WORKDIR}/nested-{tag}"], check=False)
        for folder in (f"conf-{tag}", f"keys-{tag}"):
            (ROOT / folder).rmdir()
