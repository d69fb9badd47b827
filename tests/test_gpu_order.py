"""GPU indices mean nvidia-smi's everywhere: the launch plan tells CUDA to number GPUs in PCI bus
order when the inventory picks them (`gpus:`), and a host's usage answer reads the GPUs nvidia-smi
lists the run's processes on.

No GPU exists on this machine, so nvidia-smi is a stand-in: a real executable on PATH that prints
lines in nvidia-smi's `--format=csv,noheader[,nounits]` format (written in that format, not
captured from a real board), run by the real `usage.gpus` as a subprocess.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.host import usage
from meshrun.deploy.inventory.model import Host, Network, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, plan_launch


def _host(name: str, **kw: object) -> Host:
    base = dict(ssh_address=None, user="root", port=22, identity=None, python="/p", workdir="~/w",
                network=Network.LAN, gpus=None, nproc=None, batch_size=None, env=())
    base.update(kw)
    return Host(name, "10.0.0.1" if name == "a" else "10.0.0.2", **base)  # type: ignore[arg-type]


def test_gpus_come_with_the_pci_bus_order_and_the_inventorys_env_wins() -> None:
    hosts = (_host("a", gpus=(1,)), _host("b", env=(("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),)))
    plan = plan_launch(Selection(hosts, Rendezvous("a", 29400)), LaunchOptions("r"), {}, "/p")
    a, b = plan.hosts
    assert a.env == (("MESHRUN_RUN_ID", "r"), ("MESHRUN_HOST", "a"), ("PYTHONUNBUFFERED", "1"),
                     ("CUDA_VISIBLE_DEVICES", "1"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"))
    assert b.env == (("MESHRUN_RUN_ID", "r"), ("MESHRUN_HOST", "b"), ("PYTHONUNBUFFERED", "1"),
                     ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"))
    mine = _host("a", gpus=(0,), env=(("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),))
    only = plan_launch(Selection((mine,), Rendezvous("a", 29400)), LaunchOptions("r"), {}, "/p").hosts[0]
    assert [v for k, v in only.env if k == "CUDA_DEVICE_ORDER"] == ["FASTEST_FIRST"]


UUID0, UUID1, UUID2 = (f"GPU-{n}a2b3c4d-0000-1111-2222-33334444555{n}" for n in range(3))
# `usage.GPU_QUERY`: index, util %, MiB used, MiB total, °C, UUID. An 8.75 % average if all were read.
GPUS = (f"0, 0, 3, 81559, 30, {UUID0}\n"
        f"1, 70, 30112, 81559, 71, {UUID1}\n"
        f"2, 0, 3, 81559, 31, {UUID2}\n")


def test_compute_apps_pick_the_runs_gpus() -> None:
    uuids = usage.gpu_uuids(GPUS + "3, 1, 2, 3, 4, GPU-x; rm -rf /\nNo devices were found\n")
    assert uuids == {UUID0: 0, UUID1: 1, UUID2: 2}
    apps = f"4242, {UUID1}\n999, {UUID2}\n4243, GPU-unknown\n4244\n4242, {UUID1}, extra\n[N/A], {UUID0}\n"
    assert usage.run_gpus(apps, uuids, [4242, 4243, 4244]) == {1}
    assert usage.run_gpus(apps, uuids, [7]) is None  # none of the run's: the CUDA_VISIBLE_DEVICES rule
    assert usage.run_gpus("", uuids, [4242]) is None
    assert usage.parse_gpus(GPUS, {1}) == [[1, 70, 30112, 81559, 71]]  # the answer's rows keep 5 figures


def test_nvidia_smis_answer_is_read_within_bounds() -> None:
    many = f"1, {UUID1}\n" * (usage.SMI_LINES + 10)
    assert usage.run_gpus(many, {UUID1: 1}, [1]) == {1}
    late = "\n" * usage.SMI_LINES + f"1, {UUID1}\n"  # past the lines read
    assert usage.run_gpus(late, {UUID1: 1}, [1]) is None
    assert usage.parse_gpus("9" * 20 + ", 1, 2, 3, 4\n", None) == []  # no index of 20 digits


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """An `nvidia-smi` on PATH answering GPU_QUERY with GPUS and APPS_QUERY with what the test writes."""
    apps = tmp_path / "apps.txt"
    gpus = tmp_path / "gpus.txt"
    gpus.write_text(GPUS)
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\ncase "$1" in --query-compute-apps=*) cat "{apps}";; *) cat "{gpus}";; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return apps


def test_usage_reads_the_gpu_the_run_holds(fake_smi: Path) -> None:
    """A worker on GPU 1 of 3 at 70 %: read alone, not averaged with the idle ones (8.75 % on an
    8-GPU box, under the 10 % idle threshold, and --idle-stop would stop a busy run). This test's
    own process plays the worker: nvidia-smi lists its pid."""
    fake_smi.write_text(f"{os.getpid()}, {UUID1}\n12, {UUID0}\n")
    found = usage.gpus([os.getpid()])
    assert found == [[1, 70, 30112, 81559, 71]]


def test_usage_falls_back_to_cuda_visible_devices(fake_smi: Path) -> None:
    """nvidia-smi lists none of the run's pids (CUDA not started yet, or a container's pids): the
    workers' CUDA_VISIBLE_DEVICES indices, nvidia-smi's own now that the plan sets the PCI order.
    The worker is a real process started with the plan's variables."""
    fake_smi.write_text(f"12, {UUID0}\n")
    worker = subprocess.Popen(["sleep", "30"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "2",
                                                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    try:
        assert usage.gpus([worker.pid]) == [[2, 0, 3, 81559, 31]]
    finally:
        worker.kill()
        worker.wait()
