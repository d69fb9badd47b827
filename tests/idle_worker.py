"""A torchrun-compatible script for the idle-detection test (tests/test_fab_local.py): it works a
couple of seconds on its core, says so, then sleeps (an input pipeline stuck on a dead mount would
look the same to meshrun)."""

import os
import time

end = time.monotonic() + 2.0
count = 0
while time.monotonic() < end:
    count += 1
print(f"rank {os.environ.get('RANK')} worked ({count} loops); now sleeping", flush=True)
time.sleep(600)
