"""Test workload (issue 12, hole 4): proves the inventory's env reached this rank's environment
literally, by printing digests (never the values): of MR_TOKEN, and of every MR_* variable as
sorted JSON. Then stays alive for argv[1] seconds so a test can look at every command line while
the run is up."""

import hashlib
import json
import os
import sys
import time

rank = os.environ.get("RANK")
token = os.environ.get("MR_TOKEN", "")
mine = json.dumps({k: v for k, v in os.environ.items() if k.startswith("MR_")}, sort_keys=True)
print(f"TOKEN_SHA256 rank {rank} {hashlib.sha256(token.encode()).hexdigest()}", flush=True)
print(f"ENV_SHA256 rank {rank} {hashlib.sha256(mine.encode()).hexdigest()}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
