"""The end-to-end probe of `fab check-network`: one tiny gloo all-reduce, run under torchrun
exactly as a training job (same plan: env, interface, rendezvous flags; see deploy/run/plan.py)
but for its one argument: the process-group timeout in seconds.

Every rank contributes rank + 1; the sum must be world_size * (world_size + 1) / 2. Exit status 0
means the job can start: rendezvous, store, and gloo's all-to-all TCP connections all work.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    timeout = timedelta(seconds=int(sys.argv[1]))  # the check's collective timeout, from its argv
    dist.init_process_group("gloo", timeout=timeout)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        if value.item() != expected:
            print(f"all-reduce gave {value.item()}, expected {expected}", file=sys.stderr)
            return 1
        if rank == 0:
            print(f"all-reduce ok: world size {world}, sum {value.item():g}")
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
