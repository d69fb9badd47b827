"""A GPU the run will train on that another process already fills (finding shared-hosts #5): both
runs put rank 0 on GPU 0, so the second OOMs or both crawl, and nothing said so.

No GPU exists on this machine: the GPUs are recorded nvidia-smi output, in the format the facts
probe asks for (`--query-gpu=index,name,memory.used,memory.total,uuid --format=csv,noheader,nounits`,
deploy/edges/host_queries.py), read by the controller's own parser over a fake session
(tests/fakesession.py); the verdicts compared by exact equality.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.gpus import BUSY_MIB, busy_findings
from meshrun.deploy.check.verdicts import Fingerprint, Gpu, HostFacts
from meshrun.deploy.commands import check
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.wheel import controller_identity
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from tests.fakesession import FakeSession, host

CUDA = Fingerprint("3.11.9", "2.5.0+cu124", "12.4", "2.21.5")
# Alice's run on GPU 0 of a 2x H100 host, GPU 1 idle.
TWO_H100 = ("0, NVIDIA H100 80GB HBM3, 79000, 81559, GPU-8d2c1f3a-55e1-9b7e-4c0d-2f6a9e1b7c44\n"
            "1, NVIDIA H100 80GB HBM3, 3, 81559, GPU-1a2b3c4d-55e1-9b7e-4c0d-2f6a9e1b7c45\n")
FOUR_4090 = ("0, NVIDIA GeForce RTX 4090, 20011, 24564, GPU-00000000-0000-0000-0000-000000000000\n"
             "1, NVIDIA GeForce RTX 4090, 4012, 24564, GPU-00000000-0000-0000-0000-000000000001\n"
             "2, NVIDIA GeForce RTX 4090, 1, 24564, GPU-00000000-0000-0000-0000-000000000002\n"
             "3, NVIDIA GeForce RTX 4090, 15, 24564, GPU-00000000-0000-0000-0000-000000000003\n")


def recorded(output: str) -> tuple[Gpu, ...]:
    gpus, note = check_probes._gpus(FakeSession(output), "/usr/bin/nvidia-smi")
    assert note is None
    return gpus


def facts(name: str, output: str, **changes: object) -> HostFacts:
    base = dict(name=name, address="10.9.0.2", network="lan", reachable=True, ssh_ms=3.0, fingerprint=CUDA,
                gpus=recorded(output), interface="eth0", mtu=1500, workdir="~/meshrun", disk_free_gib=50.0,
                processes=1)
    return HostFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_rank_0_on_a_full_gpu_0_warns_and_names_the_free_gpu() -> None:
    assert busy_findings([facts("gpu2", TWO_H100)]) == [Finding(Level.WARN, "gpu2", (
        "GPU 0 (NVIDIA H100 80GB HBM3) has 79000 of 81559 MiB in use before this run starts (another run's, or "
        "another process's?): the run's ranks there may run out of GPU memory, or share its compute and crawl; "
        "GPU 1 is free: list free ones in the inventory, `gpus: [1]` (or `--hosts gpu2:1` for this run only)"))]


def test_every_busy_gpu_of_the_run_is_named_and_every_free_one_offered() -> None:
    two = facts("gpu4", FOUR_4090, selected_gpus=(0, 1), processes=None)
    assert busy_findings([two]) == [Finding(Level.WARN, "gpu4", (
        "GPU 0 (NVIDIA GeForce RTX 4090) has 20011 of 24564 MiB in use, GPU 1 (NVIDIA GeForce RTX 4090) has 4012 "
        "of 24564 MiB in use before this run starts (another run's, or another process's?): the run's ranks there "
        "may run out of GPU memory, or share its compute and crawl; GPUs 2, 3 are free: list free ones in the "
        "inventory, `gpus: [2, 3]` (or `--hosts gpu4:2,3` for this run only)"))]
    full = facts("gpu4", FOUR_4090.replace(", 1, 24564", ", 9000, 24564").replace(", 15, 24564", ", 9000, 24564"),
                 processes=4)
    assert busy_findings([full])[0].message.endswith(
        "no GPU here is free: wait until they are (`nvidia-smi` there names the processes), or leave gpu4 out of "
        "--hosts")


def test_idle_gpus_or_busy_ones_the_run_does_not_use_say_nothing() -> None:
    idle = TWO_H100.replace("79000", "3")
    assert busy_findings([facts("gpu2", idle, processes=2)]) == []
    assert busy_findings([facts("gpu2", TWO_H100, selected_gpus=(1,), processes=None)]) == []  # `gpus: [1]`
    assert busy_findings([facts("gpu2", TWO_H100, fingerprint=Fingerprint("3.11.9", "2.5.0+cpu"))]) == []  # CPU
    assert busy_findings([facts("gpu2", TWO_H100, processes=3)]) == []  # more processes than GPUs: CPU
    # Mixed cards without `gpus:`: which one CUDA takes first cannot be told here (verdicts.launch_gpus).
    mixed = TWO_H100.replace("1, NVIDIA H100 80GB HBM3", "1, NVIDIA RTX A4000")
    assert busy_findings([facts("gpu2", mixed)]) == []
    assert busy_findings([facts("gpu2", "", gpu_note="nvidia-smi not found: CPU only")]) == []
    unreachable = HostFacts("gpu2", "10.9.0.2", "lan", False, error="timed out", selected_gpus=(0,))
    assert busy_findings([unreachable]) == []


@pytest.mark.parametrize(("used", "busy"), [(BUSY_MIB, False), (BUSY_MIB + 1, True), (0, False)])
def test_over_one_gib_in_use_is_busy(used: int, busy: bool) -> None:
    output = TWO_H100.replace("79000", str(used))
    assert bool(busy_findings([facts("gpu2", output)])) is busy


def test_the_pre_flight_shows_the_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu2 = replace(host(), name="gpu2", address="10.9.0.2")
    selection = Selection((gpu2,), Rendezvous(None, 29400))
    same = replace(CUDA, meshrun=str(controller_identity()))  # no skew FAIL: this test is about the GPU
    gathered = (facts("gpu2", TWO_H100, processes=None, fingerprint=same),)
    monkeypatch.setattr(check, "gather_facts", lambda *args: gathered)  # what the probes would have found
    monkeypatch.setattr(check, "probe_network", lambda *args: check_probes.Probed(None, ()))
    warnings = check._check_before_run(selection, {}, Renderer(), False)
    assert [w for w in warnings if "79000 of 81559 MiB in use" in w] == [
        "pre-flight: gpu2: " + busy_findings([facts("gpu2", TWO_H100)])[0].message]
