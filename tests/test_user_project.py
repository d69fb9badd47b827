"""meshrun run from a user's own project, as a new user would (issue 15), on the simulated cluster.

The project is a fresh git repository in a temporary directory: a seed-style `train.py` that
imports its own `models/` package, a `requirements.txt`, its own `inventory/hosts.yaml`, and a
`deploy/` and `tests/` of its own that meshrun must never import (the `deploy/` one raises if it
is). From that directory: `meshrun setup`, `meshrun train --script train.py`, `meshrun
fetch-checkpoints`; the same run through `fab` with the one-line fabfile; then all of it again with
meshrun installed from its wheel (not editable) in a venv of its own, plus the built-in trainer
(`meshrun train` without --script) beside the project's own train.py. Every run must land in the
project's `runs/` and leave meshrun's clone exactly as it was.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterator

import pytest

from meshrun.layout import SHIPPED_LIST, WORKDIR_OWNER
from meshrun.deploy.edges.wheel import controller_identity, controller_wheel
from tests.fabrun import REPO, run_id_of

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.either_cluster]

BASE = getattr(sys, "_base_executable", sys.executable)
WORKDIR = "/root/userproj"  # each host's copy of the project (not the other tests' ~/meshrun)
HOST_PYTHON = f"{WORKDIR}/.venv/bin/python"  # what `meshrun setup` makes there
HOSTS = "h1,h2,h3"

TRAIN_PY = '''\
"""The user's own seed-style DDP script: knows nothing of meshrun."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from models.toy import ToyModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(rank)
    print(f"MODELS {ToyModel.__module__} {os.path.abspath(__import__('models').__file__)}", flush=True)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(ToyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''
MODELS_PY = '''\
import torch.nn as nn


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)
'''
TRAP = 'raise ImportError("the user project\'s own deploy/ was imported: it must not be")\n'


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout


def clone_state() -> tuple[str, list[str]]:
    """meshrun's clone as git sees it, and its runs/: nothing here may change it."""
    runs = sorted(os.listdir(REPO / "runs")) if (REPO / "runs").is_dir() else []
    return git("status", "--porcelain", cwd=REPO), runs


@pytest.fixture(scope="module")
def project(testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("user") / "myproject"
    files = {"train.py": TRAIN_PY, "models/__init__.py": "", "models/toy.py": MODELS_PY,
             "requirements.txt": "numpy\n", "deploy/__init__.py": TRAP, "tests/test_toy.py": "def test(): pass\n",
             "README.md": "my research code\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    testbed.write_inventory(root / "inventory/hosts.yaml", python=HOST_PYTHON,
                            defaults_overrides={"workdir": "~/userproj"})
    git("init", "-q", cwd=root)
    git("add", "train.py", "models", "requirements.txt", "deploy", "tests", cwd=root)
    git("commit", "-qm", "my project", cwd=root)  # README.md stays untracked: shipped all the same
    yield root


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with meshrun installed from its wheel (not editable). Its other packages come from
    this interpreter's site-packages through a .pth line: a plain path, so the editable install's
    own .pth hook there is never run and `import meshrun` finds the wheel's copy."""
    venv = tmp_path_factory.mktemp("wheelvenv") / "venv"
    subprocess.run([BASE, "-m", "venv", str(venv)], check=True)
    purelib = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "reuse-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = controller_wheel(tmp_path_factory.mktemp("wheels"))
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    return venv


def meshrun(binary: Path, project: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(project.parent / "cache")}
    env.pop("MESHRUN_INVENTORY", None)
    return subprocess.run([str(binary), *args], cwd=project, capture_output=True, text=True, timeout=timeout, env=env)


def assert_script_run(binary: Path, project: Path, hosts: str, epochs: int) -> str:
    """`train --script train.py -- --epochs N` from the project: succeeds, lands in its runs/."""
    before = clone_state()
    done = meshrun(binary, project, "train", "--hosts", hosts, "--script", "train.py", "--", "--epochs", str(epochs))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = run_id_of(done.stdout)
    summary = json.loads((project / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["hosts"] == hosts.split(",")
    # Each host imported the project's own models/ from its copy of the project.
    assert re.findall(r"MODELS models\.toy (\S+)", done.stdout) == [f"{WORKDIR}/models/__init__.py"] * len(hosts.split(","))
    assert f"epoch {epochs - 1} done" in done.stdout
    assert clone_state() == before
    return run_id


def test_setup_train_and_fetch_from_the_users_project(testbed, project: Path) -> None:
    binary = Path(sys.executable).parent / "meshrun"
    mine = controller_identity()
    before = clone_state()
    setup = meshrun(binary, project, "setup", "--hosts", HOSTS, "--base", BASE, "--reuse-site", sys.executable)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    for host in HOSTS.split(","):
        assert f"{host}: created venv {WORKDIR}/.venv" in setup.stdout
        assert re.search(rf"^{host}: .*installed meshrun \(build {mine.build}\) from the controller's wheel.*; "
                         rf"installed requirements\.txt in \d+ s; meshrun {re.escape(str(mine))}, python {HOST_PYTHON}",
                         setup.stdout, re.M), setup.stdout
    # The project reached the hosts, its inventory and known_hosts did not.
    shipped = testbed.exec(2, ["find", WORKDIR, "-path", f"{WORKDIR}/.venv", "-prune", "-o", "-type", "f", "-print"])
    assert sorted(shipped.stdout.split()) == sorted(f"{WORKDIR}/{n}" for n in (
        "train.py", "models/__init__.py", "models/toy.py", "requirements.txt", "deploy/__init__.py",
        "tests/test_toy.py", "README.md", WORKDIR_OWNER, SHIPPED_LIST))  # the marker, the list of what was sent

    run_id = assert_script_run(binary, project, HOSTS, epochs=2)
    fetched = meshrun(binary, project, "fetch-checkpoints")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    for host in HOSTS.split(","):
        assert (project / "runs" / run_id / "hosts" / host / "hosts" / host / "train.log").is_file()  # its run dir
    # The run's records never travel back out to the hosts with the next sync.
    assert testbed.exec(2, ["test", "-e", f"{WORKDIR}/runs/{run_id}/launch.json"], check=False).returncode != 0
    assert clone_state() == before


def test_the_same_run_through_fab_and_a_one_line_fabfile(testbed, project: Path) -> None:
    (project / "fabfile.py").write_text("from meshrun.deploy.tasks import *  # noqa: F401,F403\n")
    try:
        fab = Path(sys.executable).parent / "fab"
        assert_script_run(fab, project, "h1,h2", epochs=1)
    finally:
        (project / "fabfile.py").unlink()


def test_a_wheel_install_runs_the_project_and_the_built_in_trainer(testbed, project: Path, wheel_venv: Path) -> None:
    binary = wheel_venv / "bin/meshrun"
    where = subprocess.run([str(wheel_venv / "bin/python"), "-c", "import meshrun.deploy; print(meshrun.deploy.__file__)"],
                           cwd="/", check=True, capture_output=True, text=True).stdout
    assert where.startswith(str(wheel_venv)) and "site-packages/meshrun/deploy/" in where
    # The wheel holds the very build the editable install packed: the hosts stay as they are.
    setup = meshrun(binary, project, "setup", "--hosts", HOSTS, "--base", BASE, "--reuse-site", sys.executable)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert setup.stdout.count("already set up, nothing to do") == 3, setup.stdout

    run_id = assert_script_run(binary, project, HOSTS, epochs=2)
    fetched = meshrun(binary, project, "fetch-checkpoints", "--run", run_id)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr

    # The built-in trainer, in a project whose own train.py would shadow a top-level `train`.
    before = clone_state()
    builtin = meshrun(binary, project, "train", "--hosts", "h1,h2", "--", "epochs=1")
    assert builtin.returncode == 0, builtin.stdout[-3000:] + builtin.stderr[-3000:]
    summary = json.loads((project / "runs" / run_id_of(builtin.stdout) / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == 2
    assert summary["metrics"]["test_acc"] > 0.5  # the digits trainer ran, not the project's script
    assert clone_state() == before
