"""Test workload (tests/test_script_restarts_cluster.py): a group of several ranks holds for argv[1]
seconds (a host is lost meanwhile); a group of one, the restart after the loss, ends at once. No
process group: the restart is torchrun's, which is what summary.json's `restarts` counts."""

import os
import sys
import time

world = int(os.environ.get("WORLD_SIZE", "1"))
print(f"HOLD start world={world}", flush=True)
if world > 1:
    time.sleep(float(sys.argv[1]))
