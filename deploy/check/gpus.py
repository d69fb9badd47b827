"""GPUs another process already fills, among those a run will train on, pure.

Every run without `gpus:` puts its first rank on GPU 0 (train/dist.gpu_index), and a shared lab
inventory's `gpus:` sends every run to the same listed ones: a second run beside a busy one runs
out of memory at start or mid-run, or both crawl. Before the run starts nothing of it is on a
GPU, so memory in use there (nvidia-smi's `memory.used`, deploy/edges/host_queries.py) is another
process's: over BUSY_MIB is a WARN naming the GPU, its memory and the free GPUs to list instead.
The host stamp lists the GPUs over the same threshold (deploy/host/stamp.py), so a pass stored with
(or without) this WARN is not reused once another GPU fills or a busy one is freed.
"""

from __future__ import annotations

from typing import Iterable

from meshrun.layout import GPU_BUSY_MIB as BUSY_MIB
from meshrun.deploy.check.findings import Finding, warn
from meshrun.deploy.check.verdicts import Gpu, HostFacts, launch_gpus

# BUSY_MIB (1 GiB, common/layout.py: the host stamp uses it too): an idle GPU shows a few MiB, a CUDA
# context alone a few hundred; over 1 GiB another process holds memory for work, whatever the card's
# size (10 % of an 80 GiB card would let an 8 GiB neighbour by).


def is_busy(gpu: Gpu) -> bool:
    return gpu.memory_used_mib > BUSY_MIB


def busy_findings(hosts: Iterable[HostFacts]) -> list[Finding]:
    """A WARN per host whose run's GPUs (launch_gpus) include one with over BUSY_MIB in use."""
    return [finding for host in hosts for finding in host_busy(host)]


def host_busy(host: HostFacts) -> list[Finding]:
    fp = host.fingerprint
    if fp is not None and fp.torch is not None and fp.cuda is None:
        return []  # a torch without CUDA trains on CPU: its own WARN says so (verdicts._gpu_findings)
    by_index = {g.index: g for g in host.gpus}
    # None: mixed cards and no `gpus:`, which ones CUDA takes cannot be told here (launch_gpus).
    busy = [by_index[i] for i in launch_gpus(host) or () if i in by_index and is_busy(by_index[i])]
    if not busy:
        return []
    held = ", ".join(f"GPU {g.index} ({g.name}) has {g.memory_used_mib} of {g.memory_total_mib} MiB in use"
                     for g in busy)
    free = sorted(g.index for g in host.gpus if not is_busy(g))
    listed = ", ".join(map(str, free))
    if free:
        fix = (f"GPU{'s' if len(free) > 1 else ''} {listed} {'are' if len(free) > 1 else 'is'} free: list free ones "
               f"in the inventory, `gpus: [{listed}]` (or `--hosts {host.name}:{listed.replace(' ', '')}` for this "
               "run only)")
    else:
        fix = ("no GPU here is free: wait until they are (`nvidia-smi` there names the processes), or leave "
               f"{host.name} out of --hosts")
    return [warn(host.name, f"{held} before this run starts (another run's, or another process's?): the run's "
                            f"ranks there may run out of GPU memory, or share its compute and crawl; {fix}")]
