"""check-network on the GPUs a run will really train on, by exact equality: a torch without CUDA
on a host with GPUs (every rank on CPU, no other warning anywhere), and a host without `gpus:`
whose processes (`nproc:`, else 1) take one GPU each, CUDA's first (train/dist.gpu_index)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.verdicts import (AllReduceResult, Fingerprint, Gpu, HostFacts, ProbeStatus, build_report,
                                           host_findings, launch_gpus)
from meshrun.deploy.commands.check import with_processes
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.render.check import gpu_cell

CUDA = Fingerprint("3.11.9", "2.5.0+cu124", "12.4", "2.21.5")
CPU_BUILD = Fingerprint("3.11.9", "2.5.0+cpu", None, None)
FOUR = tuple(Gpu(i, "NVIDIA RTX 4090", 1, 24564) for i in range(4))


def facts(name: str, **changes: object) -> HostFacts:
    base = dict(name=name, address="10.0.0.3", network="lan", reachable=True, ssh_ms=3.0, fingerprint=CUDA,
                interface="eth0", mtu=1500, workdir="~/meshrun", disk_free_gib=50.0)
    return HostFacts(**{**base, **changes})  # type: ignore[arg-type]


def starred(h: HostFacts) -> list[int]:
    return [int(line[2:].split(":")[0]) for line in gpu_cell(h).splitlines() if line.startswith("*")]


def cpu_build_warning(host: str) -> Finding:
    return Finding(Level.WARN, host, (
        f"torch 2.5.0+cpu is a build without CUDA: {host} trains on CPU and its GPUs stay idle; to use them, put "
        "`--extra-index-url https://download.pytorch.org/whl/cuXYZ` and `torch==2.5.0+cuXYZ` in requirements.txt, "
        "XYZ a CUDA its driver runs (https://pytorch.org/get-started/locally/), and run "
        f"`fab setup --hosts {host}`; or point `python:` in the inventory at an env with a CUDA build"))


def test_a_torch_without_cuda_on_a_host_with_selected_gpus_warns_that_it_trains_on_cpu() -> None:
    gpu1 = facts("gpu1", gpus=(Gpu(0, "NVIDIA H100", 0, 81559),), selected_gpus=(0,), fingerprint=CPU_BUILD,
                 processes=1)
    assert host_findings(gpu1, {}) == [cpu_build_warning("gpu1")]
    assert starred(gpu1) == []  # nothing will train on it
    # Without `gpus:` too (its one process would take GPU 0), and before `processes` is told.
    for processes in (4, None):
        unused = facts("gpu1", gpus=FOUR, fingerprint=CPU_BUILD, processes=processes)
        assert host_findings(unused, {}) == [cpu_build_warning("gpu1")]
    report = build_report((gpu1,), None, (), AllReduceResult(ProbeStatus.SKIPPED), "lan", 1.0)
    assert (report.level, report.findings) == (Level.WARN, (cpu_build_warning("gpu1"),))


def test_a_cpu_build_without_gpus_or_a_cuda_build_with_them_says_nothing() -> None:
    assert host_findings(facts("cpu1", fingerprint=CPU_BUILD, processes=2, gpu_note="nvidia-smi not found"), {}) == []
    cuda = facts("gpu1", gpus=FOUR, selected_gpus=(0, 1, 2, 3), processes=4)
    assert (host_findings(cuda, {}), starred(cuda)) == ([], [0, 1, 2, 3])
    assert host_findings(facts("gpu1", gpus=FOUR, processes=4), {}) == []  # one process per GPU without `gpus:`
    # torch missing altogether is its own FAIL, not this warning.
    no_torch = facts("gpu1", gpus=FOUR, processes=4, fingerprint=Fingerprint("3.11.9", error="no torch"))
    assert [f.level for f in host_findings(no_torch, {})] == [Level.FAIL]


def test_four_gpus_and_one_process_star_gpu_0_alone_and_warn() -> None:
    """`gpu3: {address: 10.0.0.3}` on a 4-GPU box: nproc_per_node 1, no CUDA_VISIBLE_DEVICES, so
    its one rank takes cuda:0, which for equal cards is nvidia-smi's 0."""
    gpu3 = facts("gpu3", gpus=FOUR, processes=1)
    assert launch_gpus(gpu3) == (0,)
    assert gpu_cell(gpu3) == ("* 0: NVIDIA RTX 4090, 1/24564 MiB used\n  1: NVIDIA RTX 4090, 1/24564 MiB used\n"
                              "  2: NVIDIA RTX 4090, 1/24564 MiB used\n  3: NVIDIA RTX 4090, 1/24564 MiB used")
    assert host_findings(gpu3, {}) == [Finding(Level.WARN, "gpu3", (
        "4 GPUs here but 1 process (no `gpus:` in the inventory): the run trains on GPU 0 and leaves the others "
        "idle; set `gpus: [0, 1, 2, 3]` to use them all"))]
    two = facts("gpu3", gpus=FOUR, processes=2)
    assert starred(two) == [0, 1]
    assert host_findings(two, {}) == [Finding(Level.WARN, "gpu3", (
        "4 GPUs here but 2 processes (no `gpus:` in the inventory): the run trains on GPUs 0, 1 and leaves the "
        "others idle; set `gpus: [0, 1, 2, 3]` to use them all"))]


def test_more_processes_than_gpus_star_none_and_say_it_trains_on_cpu() -> None:
    crowded = facts("gpu3", gpus=FOUR, processes=6)
    assert (launch_gpus(crowded), starred(crowded)) == ((), [])
    assert host_findings(crowded, {}) == [Finding(Level.WARN, "gpu3", (
        "6 processes but 4 GPUs here and no `gpus:` in the inventory: one GPU per process or none, so it trains on "
        "CPU (on dist.backend=gloo they share the GPUs); set `nproc: 4`, or list `gpus: [0, 1, 2, 3]` in its place"))]
    # A CPU build there: the same warning, not a second one.
    assert host_findings(replace(crowded, fingerprint=CPU_BUILD), {}) == host_findings(crowded, {})


def test_mixed_cards_without_gpus_star_none_since_cuda_puts_the_fastest_first() -> None:
    mixed = facts("ws", gpus=(Gpu(0, "NVIDIA GeForce GT 1030", 300, 2048), Gpu(1, "NVIDIA RTX 4090", 1, 24564)),
                  processes=1)
    assert launch_gpus(mixed) is None
    assert gpu_cell(mixed) == ("  0: NVIDIA GeForce GT 1030, 300/2048 MiB used\n"
                               "  1: NVIDIA RTX 4090, 1/24564 MiB used\n"
                               "  (no `gpus:`: the run takes the 1 fastest, by CUDA's count)")
    assert host_findings(mixed, {}) == [Finding(Level.WARN, "ws", (
        "2 GPUs here but 1 process (no `gpus:` in the inventory): the run trains on one GPU (the fastest, by "
        "CUDA's count) and leaves the others idle; set `gpus: [0, 1]` to use them all"))]


def test_the_processes_come_from_the_inventory_as_the_launch_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("hosts:\n  gpu1: {address: 10.0.0.1, gpus: [1, 2]}\n  gpu2: {address: 10.0.0.2, nproc: 3}\n"
                    "  gpu3: {address: 10.0.0.3}\n")
    inventory = load_inventory(path, tmp_path)
    hosts = select_hosts(inventory, None).hosts
    bare = tuple(facts(h.name, selected_gpus=h.gpus) for h in hosts)
    assert [f.processes for f in with_processes(bare, hosts)] == [2, 3, 1]
    gpu3 = with_processes(bare, hosts)[2]
    assert host_findings(replace(gpu3, gpus=FOUR), {})[0].message.startswith("4 GPUs here but 1 process")
    overridden = select_hosts(inventory, "gpu3:0,1,2,3").hosts
    assert [f.processes for f in with_processes(bare[2:], overridden)] == [4]
