"""Test workload (tests/test_script_restarts_cluster.py): a group of several ranks holds in a gloo
barrier loop for argv[1] seconds, as a DDP script's collectives would; a host lost meanwhile fails
the barrier, and torchrun starts the group again. A group of one, that restart, ends at once."""

import os
import sys
import time
from datetime import timedelta

world = int(os.environ.get("WORLD_SIZE", "1"))
print(f"HOLD start world={world}", flush=True)
if world > 1:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline:
        dist.barrier()
        time.sleep(0.5)
    dist.destroy_process_group()
