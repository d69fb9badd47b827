"""Prints, as JSON, the environment variables whose names start with argv[1] (a test's own
prefix): what the remote worker process really received."""
import json
import os
import sys

prefix = sys.argv[1]
print("ENV " + json.dumps({k: v for k, v in sorted(os.environ.items()) if k.startswith(prefix)}), flush=True)
