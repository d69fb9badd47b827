"""Environment names an inventory's `env:` may not set: those meshrun or torchrun set for each rank.

The inventory's `env` reaches torchrun last and wins over meshrun's own variables (deploy/run/plan.py
`host_env`), so a name meshrun derives from another field would silently beat that field. torchrun sets
its own names for every worker over whatever it was given, so one written there is silently ignored.
Both are refused at load, in one line (`refused`).

CUDA_VISIBLE_DEVICES is meshrun's only where `gpus:` (or a `--hosts NAME:0,1` GPU list) selects the
host's GPUs: there `CUDA_VISIBLE_DEVICES: "2,3"` beside `gpus: [0, 1]` trained on
GPU 2 while the pre-flight had checked GPU 0, so that pair is refused (`gpus_conflict`, checked by the
plan, deploy/run/plan.py, where `--hosts` has been applied). Without `gpus:` meshrun sets none, and
the inventory's value is the only way to say a MIG slice, a GPU UUID, or `""` (a GPU host on CPU).
CUDA_DEVICE_ORDER beside `gpus:` stays the user's to override, as it always was (tests/test_gpu_order.py):
`gpus:` then counts in that order. Pure.
"""

from __future__ import annotations

import re

from meshrun.events import NOTIFY_KEY
from meshrun.layout import ENV_BATCH_SIZE, ENV_SITE

MESHRUN_PREFIX = "MESHRUN_"  # the run's tags, the ranks' MESHRUN_RUN_DIR, the agent's own marks
# Set by torchrun for every worker over any value it was given: the world comes from the rendezvous
# (torch/distributed/elastic/agent/server/local_elastic_agent.py `_start_workers`; TORCHELASTIC_ERROR_FILE
# in elastic/multiprocessing/api.py; TORCHELASTIC_SIGNALS_TO_HANDLE from torchrun's own flag, launcher/
# api.py). torchrun's agent settings (TORCHELASTIC_ENABLE_FILE_TIMER, _TIMER_FILE, _HEALTH_CHECK_PORT,
# _UNINTERRUPTIBLE_STATE_TIMEOUT) are read from its environment, this one: they stay the user's.
TORCHRUN_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"})
# meshrun's variables that another field of the inventory decides: that field is the place to say it.
FROM_FIELD = {ENV_BATCH_SIZE: "batch_size", ENV_SITE: "site", NOTIFY_KEY: "notify"}
GPU_NAMES = ("CUDA_VISIBLE_DEVICES",)  # meshrun's alone to set where `gpus:` is given
GPU_LIST_RE = re.compile(r"[0-9]+(,[0-9]+)*")


def refused(name: str) -> tuple[str, str] | None:
    """(problem, fix) for an `env:` name meshrun or torchrun always sets, else None."""
    if name in FROM_FIELD:
        return f"{name} is meshrun's to set from `{FROM_FIELD[name]}:`", f"remove it and set `{FROM_FIELD[name]}:`"
    if name.startswith(MESHRUN_PREFIX):
        return f"{name} is meshrun's to set", "remove it (docs/scripts.md lists what each rank is given)"
    if name in TORCHRUN_NAMES:
        return (f"{name} is torchrun's to set for each worker, over any value given",
                "remove it: the hosts, `gpus:`/`nproc:` and `rendezvous:` decide the world")
    return None


def gpus_conflict(host: str, gpus: tuple[int, ...] | None,
                  env: tuple[tuple[str, str], ...]) -> tuple[str, str, str] | None:
    """(name, problem, fix) when `env` sets a name meshrun sets from `gpus`, else None."""
    if gpus is None:
        return None
    given = dict(env)
    name = next((n for n in GPU_NAMES if n in given), None)
    if name is None:
        return None
    listed = ", ".join(map(str, gpus))
    problem = (f"`env:` sets {name}, and `gpus:` (or `--hosts {host}:...`) selects GPU{'s' if len(gpus) > 1 else ''} "
               f"{listed}, from which meshrun sets it")
    value = given[name].replace(" ", "")
    if name == "CUDA_VISIBLE_DEVICES" and GPU_LIST_RE.fullmatch(value):
        keep = f"list the GPUs in `gpus:` only, here `gpus: [{', '.join(value.split(','))}]`"
    else:
        keep = f"keep `gpus:` and remove env.{name}"
    return name, problem, f"{keep}; or remove `gpus:` (and the --hosts GPU list) to keep the env value"
