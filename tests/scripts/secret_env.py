"""Test workload (issue 12, hole 4): proves the inventory's MR_TOKEN reached this rank's
environment by printing its sha256 (never the value), then stays alive for argv[1] seconds so
a test can look at every command line while the run is up."""

import hashlib
import os
import sys
import time

token = os.environ.get("MR_TOKEN", "")
print(f"TOKEN_SHA256 rank {os.environ.get('RANK')} {hashlib.sha256(token.encode()).hexdigest()}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
