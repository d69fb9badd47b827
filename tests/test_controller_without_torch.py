"""A controller without torch (macos55 finding 2): meshrun's pyproject leaves torch out on Intel
Macs, where PyTorch publishes no torch>=2.4 wheel. Nothing on the controller imports torch; the one
thing there that needs it is `--comm` (any hook, `auto` too: the floors come from the gradients'
size, which `python -m meshrun.train --describe` reads by building the model here). Without torch
that is one line saying so and how to install it, exit 1, before any host is contacted; it was
the trainer's ModuleNotFoundError's last line.

No torch-less Python here: each test runs a fresh Python with `sys.modules['torch'] = None`, so an
import of torch (or `importlib.util.find_spec`) in that process finds none. The child processes it
starts are not blocked: that the controller looks for torch itself, not through them, is checked too."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.clirun import git_project, meshrun_env

NO_TORCH = "import sys; sys.modules['torch'] = None\n"


def without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=meshrun_env())


def expected(python: str) -> str:
    return (f"--comm needs torch in this Python ({python}) to size the model's gradients: `python -m meshrun.train "
            f"--describe` builds the model here; install it ({shlex.quote(python)} -m pip install 'torch>=2.4'; "
            "PyTorch has no such wheel for Intel Macs), or train without --comm and name the hook after --, e.g. "
            "`-- comm.hook=powersgd`")


def test_train_with_comm_and_no_torch_here_is_one_line_exit_1(tmp_path: Path) -> None:
    """The real `meshrun train --comm auto` (its program's main, in a Python without torch), in a fresh
    project with no inventory: the line comes before the inventory is even looked for."""
    root = git_project(tmp_path)
    done = without_torch("sys.argv = ['meshrun', 'train', '--comm', 'auto']\n"
                         "from meshrun.deploy.program import main\nmain()\n", root)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {expected(sys.executable)}"]
    assert "Traceback" not in done.stderr


def test_a_named_hook_needs_torch_as_auto_does(tmp_path: Path) -> None:
    """`check_comm` (what `fab train` calls for every --comm) with a named hook and with auto."""
    code = ("from pathlib import Path\nfrom meshrun.deploy.edges.comm import check_comm\n"
            "from meshrun.deploy.errors import MeshrunError\nfrom meshrun.deploy.run.plan import Workload\n"
            "for hook in ('powersgd', 'auto'):\n"
            "    try:\n        check_comm(hook, Workload(), Path('.'))\n        print('described')\n"
            "    except MeshrunError as err:\n        print(err.exit_code, err)\n")
    done = without_torch(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"1 {expected(sys.executable)}"] * 2


def test_the_controller_imports_and_checks_the_trainer_config_without_torch(tmp_path: Path) -> None:
    """What the README says: torch here is for --comm and local training only. Every controller
    module imports without it, and the trainer's `--check` (run before every built-in training run)
    passes in a Python without it."""
    code = ("import importlib, pkgutil\nimport meshrun.deploy as d\n"
            "names = [m.name for m in pkgutil.walk_packages(d.__path__, 'meshrun.deploy.')\n"
            "         if not m.name.startswith('meshrun.deploy.host')]\n"
            "for name in names:\n    importlib.import_module(name)\n"
            "print(len(names) > 100, 'torch' in sys.modules and sys.modules['torch'] is not None)\n"
            "import runpy\nsys.argv = ['meshrun.train', '--check']\n"
            "runpy.run_module('meshrun.train', run_name='__main__')\n")
    done = without_torch(code, tmp_path)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["True False"]), done.stderr
