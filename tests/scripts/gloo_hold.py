"""Test workload (issue 12, hole 6): joins the gloo process group, all-reduces once, says so, then
holds the group (its store and gloo sockets open) for argv[1] seconds so a test can probe them."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
print(f"GLOO_READY rank {dist.get_rank()} sum {int(value.item())}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
dist.barrier()
dist.destroy_process_group()
