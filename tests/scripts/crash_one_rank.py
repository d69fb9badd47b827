"""Test workload: after a barrier the last rank crashes while every other rank sleeps.
Nothing on the sleeping ranks would end them: only meshrun's stop can."""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == dist.get_world_size() - 1:
    print("CRASHING on purpose", flush=True)
    sys.exit(7)
print("sleeping", flush=True)
time.sleep(600)
