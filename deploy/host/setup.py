"""Host side of `fab setup`, standard library only: make `<workdir>/.venv` run this project.

Run from the synced workdir as `BASE -m deploy.host.setup [--reuse-site PYTHON]`. Steps, each
skipped when already done, so a second run changes nothing:
1. create the venv (`--system-site-packages`, so a system-wide CUDA torch is reused);
2. with `--reuse-site`, add a .pth line so the venv also sees another interpreter's packages
   (a shared lab env that already has torch: no 5 GB download per host);
3. `pip install -e .` when meshrun is not installed from this workdir, or pyproject.toml changed
   since the last install (its sha256 is kept in `.venv/meshrun-installed`).
Prints one JSON object: the actions taken, the venv's python, and its torch version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VENV = Path(".venv")
STAMP = VENV / "meshrun-installed"
PTH = "meshrun-reuse-site.pth"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def isolation_flags() -> list[str]:
    """Build with the venv's own setuptools when it is recent enough: a host without a package
    index (an air-gapped box, a lab network) cannot fetch one into an isolated build env.
    Editable installs need setuptools >= 64, and bdist_wheel (built in from 70.1, else `wheel`)."""
    code = ("import importlib.util as u, setuptools, sys; v = tuple(int(x) for x in setuptools.__version__.split('.')[:2]);"
            " sys.exit(not (v >= (70, 1) or (v >= (64, 0) and u.find_spec('wheel'))))")
    ok = subprocess.run([str(venv_python()), "-c", code], capture_output=True).returncode == 0
    return ["--no-build-isolation"] if ok else []


def pyproject_digest() -> str:
    return hashlib.sha256(Path("pyproject.toml").read_bytes()).hexdigest()


def installed_here() -> bool:
    """meshrun imports from this workdir's code, seen from outside it, and nothing changed since."""
    code = "import deploy, train, sys; print(deploy.__file__)"
    done = subprocess.run([os.path.abspath(venv_python()), "-c", code], capture_output=True, text=True, cwd="/")
    here = str(Path("deploy").resolve())
    fresh = STAMP.exists() and STAMP.read_text().strip() == pyproject_digest()
    return done.returncode == 0 and done.stdout.strip().startswith(here) and fresh


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.host.setup")
    parser.add_argument("--reuse-site", default=None, help="interpreter whose packages the venv should also see")
    args = parser.parse_args()
    actions: list[str] = []
    if not venv_python().exists():
        # With --reuse-site, pip and setuptools come from the reused env too (newer than ensurepip's).
        without_pip = ["--without-pip"] if args.reuse_site else []
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", *without_pip, str(VENV)], check=True)
        actions.append(f"created venv {VENV.resolve()}")
    if args.reuse_site:
        target = Path(site_packages(str(venv_python()))) / PTH
        line = site_packages(args.reuse_site) + "\n"
        if not target.exists() or target.read_text() != line:
            target.write_text(line)
            actions.append(f"venv reuses the packages of {args.reuse_site}")
    if not installed_here():
        started = time.monotonic()
        pip = subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", *isolation_flags(), "-e", "."],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            lines = [l for l in pip.stderr.splitlines() if l.strip() and not l.startswith(("note:", "hint:"))]
            print(json.dumps({"error": "pip install -e . failed: " + " | ".join(lines[-3:])}))
            return 1
        STAMP.write_text(pyproject_digest() + "\n")
        actions.append(f"installed meshrun (pip install -e .) in {time.monotonic() - started:.0f} s")
    torch = subprocess.run([str(venv_python()), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    print(json.dumps({"actions": actions, "python": os.path.abspath(venv_python()),
                      "torch": torch.stdout.strip() if torch.returncode == 0 else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
