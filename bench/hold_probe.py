"""bench/scale.py's detached workload: join the process group, pass one barrier, then hold the
slot (a run `fab status` reports and `fab stop` must stop)."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"BARRIER rank={dist.get_rank()} t={time.time():.3f}", flush=True)
time.sleep(3600)
