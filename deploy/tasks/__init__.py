"""Fab task definitions, one module per task, re-exported by `fabfile.py`.

Each task parses its flags and hands over to `deploy/commands/<task>.py`. Tasks that act on
many hosts declare `hosts` themselves: a Fabric task without it is cloned per host and run one
host after another, which would start torchrun on gpu1 and never on gpu2.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project: fabfile.py, runs/, the synced files

HOSTS_HELP = "hosts, groups or host:0,1 (GPU override), comma-separated; default: all"
INVENTORY_HELP = "inventory YAML (default: $MESHRUN_INVENTORY or inventory/local.yaml)"
DEBUG_HELP = "show tracebacks of internal errors"
RUN_HELP = "run id (default: the newest run)"
