"""A run that trains on CPU on a host with a GPU (`nproc` above the GPU count, a CPU build of torch,
a driver too old) is judged by its CPU share, not by the idle GPU beside it: `--idle-stop` stopped
such runs while they trained.

No GPU here, so nvidia-smi is a stand-in: a real executable on PATH printing lines in its
`--format=csv,noheader[,nounits]` format, run by the real usage probe as a subprocess. The worker is
a real process carrying the run's tags, busy on a core.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.host import usage
from meshrun.deploy.host.idle import sample_of
from meshrun.idlerule import utilisation

UUID0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
UUID1 = "GPU-0a1b2c3d-1111-4000-8000-000000000001"
GPUS = f"0, 0, 3, 24564, 35, {UUID0}\n1, 70, 20112, 24564, 61, {UUID1}\n"  # GPU 1: someone else's job
RUN, HOST = "r-cpu-on-gpu", "h1"


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` answering GPU_QUERY with GPUS and APPS_QUERY with what the test writes."""
    apps = tmp_path / "apps.txt"
    apps.write_text(f"4242, {UUID1}\n")  # a stranger's process on GPU 1; none of the run's
    (tmp_path / "gpus.txt").write_text(GPUS)
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\ncase "$1" in --query-compute-apps=*) cat "{apps}";; '
                    f'*) cat "{tmp_path / "gpus.txt"}";; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return apps


def _worker(**env: str) -> subprocess.Popen[bytes]:
    tags = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen([sys.executable, "-c", "print('started', flush=True)\nwhile True: pass"],
                            env={**tags, "MESHRUN_RUN_ID": RUN, "MESHRUN_HOST": HOST, **env},
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"  # exec'd: its tags are readable
    return proc


def _two_samples(worker: subprocess.Popen[bytes]) -> tuple[dict, dict]:
    """Two `busy` answers with the worker's CPU time grown by at least 0.2 s between them."""
    first = usage.busy(RUN, HOST)[0]
    start = usage.cpu_seconds(worker.pid) or 0.0
    deadline = time.monotonic() + 60
    while (usage.cpu_seconds(worker.pid) or 0.0) < start + 0.2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return first, usage.busy(RUN, HOST)[0]


def test_a_run_on_cpu_is_judged_by_its_cpu_not_the_idle_gpu(fake_smi: Path) -> None:
    worker = _worker()  # no CUDA_VISIBLE_DEVICES: the watch shows every GPU
    try:
        first, second = _two_samples(worker)
        shown = usage.usage(RUN, HOST)["gpus"]
    finally:
        worker.kill()
        worker.wait()
    assert first["gpu_util"] is None and second["gpu_util"] is None  # before: [0, 70]
    assert shown == [[0, 0, 3, 24564, 35], [1, 70, 20112, 24564, 61]]  # still shown by the watch
    util = utilisation(sample_of(first), sample_of(second))
    cpu = [(second["per_pid"][str(worker.pid)] - first["per_pid"][str(worker.pid)]) / (second["time"] - first["time"])]
    assert util == max(cpu) and util > 0  # the worker's CPU share; before: 0.35 (mean of the GPUs')


def test_visible_devices_alone_do_not_make_a_gpu_the_runs(fake_smi: Path) -> None:
    """The workers name GPU 0 (CUDA_VISIBLE_DEVICES) but nvidia-smi lists none of them on it."""
    worker = _worker(CUDA_VISIBLE_DEVICES="0")
    try:
        sample, _, shown = usage.busy(RUN, HOST)
    finally:
        worker.kill()
        worker.wait()
    assert shown == [[0, 0, 3, 24564, 35]] and sample["gpu_util"] is None  # before: [0]


def test_a_gpu_the_run_is_on_still_judges_it(fake_smi: Path) -> None:
    worker = _worker()
    fake_smi.write_text(f"4242, {UUID1}\n{worker.pid}, {UUID0}\n")
    try:
        sample, _, shown = usage.busy(RUN, HOST)
    finally:
        worker.kill()
        worker.wait()
    assert shown == [[0, 0, 3, 24564, 35]] and sample["gpu_util"] == [0]


def test_held_util_reads_only_the_runs_gpus() -> None:
    rows = [[0, 0, 3, 24564, 35], [1, 70, 20112, 24564, 61], [2, None, 10, 16384, 40]]
    assert usage.held_util(rows, {1}) == [70]
    assert usage.held_util(rows, {2}) is None  # N/A: no figure, the CPU share judges
    assert usage.held_util(rows, None) is None
    assert usage.held_util(None, {0}) is None
