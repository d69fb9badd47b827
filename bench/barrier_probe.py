"""bench/launch.py's workload: join the process group, pass one barrier, print when, exit."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"BARRIER rank={dist.get_rank()} t={time.time():.3f}", flush=True)
dist.destroy_process_group()
