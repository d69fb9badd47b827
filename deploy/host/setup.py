"""Host side of `fab setup`, standard library only: make `<workdir>/.venv` run meshrun and the project.

Shipped as `BASE -c <this file> ...` (the host may have no meshrun yet) and run in the workdir,
where `fab setup` has synced the project and pushed the controller's meshrun wheel. Steps, each
skipped when already done, so a second run changes nothing:
1. create the venv (`--system-site-packages`, so a system-wide CUDA torch is reused);
2. with `--reuse-site`, add a .pth line so the venv also sees another interpreter's packages
   (a shared lab env that already has torch: no 5 GB download per host);
3. install the pushed wheel when the venv holds another build (`.venv/meshrun-installed` keeps
   what was installed); its dependencies come from the host's index or the reused packages;
4. install the project's requirements (`--requirements FILE` or `--requirement LINE`...) when
   they changed since the last install.
Prints one JSON object: the actions taken, the venv's python, and its torch version; or {"error"}.
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
# Each step has a time limit, within the controller's own for the whole setup (an hour): a pip
# that hangs on a dead index must not keep running here after the controller gave up.
PIP_TIMEOUT_S = 3000  # a first torch download
VENV_TIMEOUT_S = 600
PROBE_TIMEOUT_S = 120  # an interpreter answering one question (torch's import on a cold disk)


class SetupFailed(Exception):
    pass


def venv_python() -> Path:
    return VENV / "bin" / "python"


def site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                          timeout=PROBE_TIMEOUT_S).stdout.strip()


def pip(what: str, *args: str) -> float:
    """Run the venv's pip; the seconds it took. A failure raises with pip's last lines."""
    started = time.monotonic()
    try:
        done = subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                              capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SetupFailed(f"pip did not finish installing {what} within {PIP_TIMEOUT_S} s; is the package index "
                          "reachable from the host?") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith(("note:", "hint:"))]
        raise SetupFailed(f"pip could not install {what}: " + " | ".join(lines[-3:]))
    return time.monotonic() - started


def read_stamp() -> dict[str, str]:
    try:
        found = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def requirements_digest(args: argparse.Namespace) -> str:
    text = Path(args.requirements).read_bytes() if args.requirements else "\n".join(args.requirement).encode()
    return hashlib.sha256(text).hexdigest() if (args.requirements or args.requirement) else ""


def make_venv(reuse_site: str | None, actions: list[str]) -> None:
    # A venv whose pip never came (Debian's python without python3-venv stops after the
    # interpreter) is made again: skipped, every later setup failed with "No module named pip".
    whole = venv_python().exists() and (reuse_site is not None or (VENV / "bin" / "pip").exists())
    if not whole:
        # With --reuse-site, pip and setuptools come from the reused env too (newer than ensurepip's).
        without_pip = ["--without-pip"] if reuse_site else []
        done = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", *without_pip,
                               str(VENV)], capture_output=True, text=True, timeout=VENV_TIMEOUT_S)
        if done.returncode != 0:
            lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            said = " | ".join(lines[-3:]) or f"exit status {done.returncode}"
            raise SetupFailed(f"{sys.executable} -m venv failed: {said}; on Debian or Ubuntu install python3-venv "
                              "(apt install python3-venv), or pass --base another Python >= 3.10")
        actions.append(f"created venv {VENV.resolve()}")
    if reuse_site:
        target = Path(site_packages(str(venv_python()))) / PTH
        line = site_packages(reuse_site) + "\n"
        if not target.exists() or target.read_text() != line:
            target.write_text(line)
            actions.append(f"venv reuses the packages of {reuse_site}")


def install(args: argparse.Namespace, actions: list[str]) -> None:
    stamp = read_stamp()
    if args.force or stamp.get("build") != args.build:
        # --force-reinstall --no-deps: a meshrun of the same version seen through --reuse-site
        # must not count as installed. Then the dependencies, which pip leaves alone when present.
        seconds = pip("meshrun", "--no-deps", "--force-reinstall", args.wheel) + pip("meshrun's dependencies", args.wheel)
        stamp = {"build": args.build}
        actions.append(f"installed meshrun (build {args.build}) from the controller's wheel in {seconds:.0f} s")
        STAMP.write_text(json.dumps(stamp) + "\n")
    wanted = requirements_digest(args)
    if wanted and (args.force or stamp.get("requirements") != wanted):
        what = args.requirements or "the project's dependencies"
        seconds = pip(what, *(["-r", args.requirements] if args.requirements else args.requirement))
        actions.append(f"installed {what} in {seconds:.0f} s")
    STAMP.write_text(json.dumps({**stamp, "requirements": wanted}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(prog="meshrun host setup")
    parser.add_argument("--wheel", required=True, help="the controller's meshrun wheel, pushed here")
    parser.add_argument("--build", required=True, help="its build (the digest check-network compares)")
    parser.add_argument("--reuse-site", default=None, help="interpreter whose packages the venv should also see")
    parser.add_argument("--requirements", default=None, help="the project's requirements file")
    parser.add_argument("--requirement", action="append", default=[], help="one requirement (from pyproject.toml)")
    parser.add_argument("--force", action="store_true", help="install again even if the stamp says done")
    args = parser.parse_args()
    actions: list[str] = []
    try:
        make_venv(args.reuse_site, actions)
        install(args, actions)
    except (SetupFailed, subprocess.SubprocessError, OSError) as err:
        print(json.dumps({"error": str(err), "actions": actions}))
        return 1
    try:
        torch = subprocess.run([str(venv_python()), "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        version = torch.stdout.strip() if torch.returncode == 0 else None
    except subprocess.TimeoutExpired:
        version = None
    print(json.dumps({"actions": actions, "python": os.path.abspath(venv_python()), "torch": version}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
