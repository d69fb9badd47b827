"""Test workload (deploy/host/exitbarrier.py): the rank on the host named by argv[1] ends at once,
every other rank holds for argv[2] seconds. No process group: torchrun's exit barrier is the
agents' own, through the rendezvous store."""

import os
import sys
import time

if os.environ.get("MESHRUN_HOST") == sys.argv[1]:
    print("UNEVEN done at once", flush=True)
else:
    print("UNEVEN holding", flush=True)
    time.sleep(float(sys.argv[2]))
