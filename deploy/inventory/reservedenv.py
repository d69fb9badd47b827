"""Environment names an inventory's `env:` may not set: those meshrun or torchrun set for each rank.

The inventory's `env` reaches torchrun last and wins over meshrun's own variables (deploy/run/plan.py
`host_env`), so a name meshrun derives from another field would silently beat that field:
`CUDA_VISIBLE_DEVICES: "2,3"` trained on GPU 2 of a host whose `gpus: [0, 1]` (and `--hosts gpu1:1`)
the pre-flight had checked. torchrun sets its own names for every worker over whatever it was given,
so one written there is silently ignored. Both are refused at load, in one line. Pure.
"""

from __future__ import annotations

import re

from meshrun.events import NOTIFY_KEY
from meshrun.layout import ENV_BATCH_SIZE, ENV_SITE

MESHRUN_PREFIX = "MESHRUN_"  # the run's tags, the ranks' MESHRUN_RUN_DIR, the agent's own marks
# Set by torchrun for every worker (torch.distributed.run): the world comes from the rendezvous.
TORCHRUN_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE"})
TORCHRUN_PREFIX = "TORCHELASTIC_"
# meshrun's variables that another field of the inventory decides: that field is the place to say it.
FROM_FIELD = {ENV_BATCH_SIZE: "batch_size", ENV_SITE: "site", NOTIFY_KEY: "notify"}
GPU_LIST_RE = re.compile(r"[0-9]+(,[0-9]+)*")


def refused(name: str, value: str) -> tuple[str, str] | None:
    """(problem, fix) for an `env:` name meshrun or torchrun sets, else None."""
    if name == "CUDA_VISIBLE_DEVICES":
        listed = value.replace(" ", "")
        example = f", here `gpus: [{', '.join(listed.split(','))}]`" if GPU_LIST_RE.fullmatch(listed) else ""
        fix = f"remove it and list the GPUs in `gpus:`{example}"
        return "CUDA_VISIBLE_DEVICES is meshrun's to set from `gpus:`", fix
    if name == "CUDA_DEVICE_ORDER":
        return ("CUDA_DEVICE_ORDER is meshrun's to set with `gpus:` (PCI_BUS_ID: nvidia-smi's numbering, the "
                "one `gpus:` uses)", "remove it and list the GPUs in `gpus:` by their nvidia-smi index")
    if name in FROM_FIELD:
        return f"{name} is meshrun's to set from `{FROM_FIELD[name]}:`", f"remove it and set `{FROM_FIELD[name]}:`"
    if name.startswith(MESHRUN_PREFIX):
        return f"{name} is meshrun's to set", "remove it (docs/scripts.md lists what each rank is given)"
    if name in TORCHRUN_NAMES or name.startswith(TORCHRUN_PREFIX):
        return (f"{name} is torchrun's to set for each worker, over any value given",
                "remove it: the hosts, `gpus:`/`nproc:` and `rendezvous:` decide the world")
    return None
