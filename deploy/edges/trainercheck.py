"""The built-in trainer's config and `-- key=value` overrides, checked on the controller before any
host is contacted: an unknown key or an impossible number is one line and exit status 2, not a
failure on every host after the connections, the sync and the pre-flight.

The controller never imports the trainer (docs/architecture.md): it runs `python -m meshrun.train
--check` here, with the arguments the hosts will get (`deploy/run/plan.trainer_args`), in the
project (a `--config` path is the project's). It is this controller's meshrun, the build the
pre-flight requires of every host, so what passes here loads there. A user's `--script` takes
its own arguments: they are not checked.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from meshrun.layout import TRAINER_MODULE
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.shown import one_line
from meshrun.deploy.run.plan import Workload, trainer_args

CHECK_TIMEOUT_S = 60  # it imports no torch: well under a second
PREFIXES = ("train: error: ", "python -m meshrun.train: error: ")  # the trainer's and argparse's


def check_trainer_args(workload: Workload, pg_timeout_s: int, root: Path) -> None:
    """InputError naming what the trainer refused; nothing for a `--script` workload."""
    if workload.script is not None:
        return
    argv = [sys.executable, "-m", TRAINER_MODULE, "--check", *trainer_args(workload, pg_timeout_s)]
    try:
        done = subprocess.run(argv, cwd=root, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MeshrunError(f"the trainer's config check (python -m meshrun.train --check) did not finish in "
                           f"{CHECK_TIMEOUT_S} s; is --config a file in the project?") from None
    if done.returncode == 0:
        return
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    reason = next((last[len(p):] for p in PREFIXES if last.startswith(p)), last)
    if done.returncode != 2:
        raise MeshrunError(one_line(f"could not check the trainer's config with `python -m meshrun.train --check`: "
                                    f"{reason}"))
    raise InputError(f"the trainer refuses its arguments: {reason}; fix --config or the key=value overrides after --"
                     f"{_script_hint(workload, root)}")


def _script_hint(workload: Workload, root: Path) -> str:
    """A script named after `--` without `--script` (`fab train -- train.py --epochs 3`) went to the
    built-in trainer as an override: name the flag it wanted."""
    first = workload.args[0] if workload.args else ""
    if not first.endswith(".py") or not (root / first).is_file():
        return ""
    rest = f" -- {shlex.join(workload.args[1:])}" if len(workload.args) > 1 else ""
    return f"; to run your own script: fab train --script {shlex.quote(first)}{rest}"
