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
   they changed since the last install;
5. with `--install-project`, the project itself, editable and without dependencies (`pip install
   --no-deps -e .`, deploy/run/requirements.py says why) when its build files (BUILD_FILES) changed.
Prints one JSON object: the actions taken, the venv's python, its torch version, and the host's
home and workdir (the controller resolves the inventory's `python:` with them); or {"error"}.

One setup at a time per workdir: a Ctrl-C or a dropped SSH connection sends this script no signal
(no pty), so its pip runs on, and a rerun's pip into the same venv could corrupt it. The rerun
answers {"error", "busy": true} instead, naming the running one's pid; ending that pid (TERM,
HUP) ends its pip too.

No setup under a run either: pip would replace meshrun and the project's packages in the venv a
run executes from, and its next worker restart or succession would import other builds than its
peers (or none, mid-install). Each run's agent holds its `agent.lock` for its whole life
(`--agent-locks` names where, from common/layout.py); a lock held there answers busy, naming the
run. The test is a shared flock taken and let go at once: the lock file is never written.
`--check-only` makes that test alone (no setup lock, no venv, no pip): the controller asks it of
every host before it syncs the project or pushes the wheel, which would already change the files
a running run executes from.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

VENV = Path(".venv")
STAMP = VENV / "meshrun-installed"
PTH = "meshrun-reuse-site.pth"
BUILD_FILES = ("pyproject.toml", "setup.py", "setup.cfg")  # what pip reads to build the project


def lock_file(workdir: Path) -> Path:
    """The lock of setups into `workdir`'s venv: in the user's cache, keyed by the workdir's real path.
    Not in the workdir, which may be the user's own project (the local host's `workdir: .`: a stray
    file in its `git status`), nor in .venv, which a user removes to start again."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(os.path.realpath(workdir).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return cache / "meshrun" / "setup" / f"{key}.lock"

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
    stamp = {**stamp, "requirements": wanted}
    STAMP.write_text(json.dumps(stamp) + "\n")  # what is done is done, whatever the project's build does
    if args.install_project and (args.force or stamp.get("project") != (built := build_digest())):
        seconds = pip("the project itself", "--no-deps", "-e", ".")
        actions.append(f"installed the project itself (pip install --no-deps -e .) in {seconds:.0f} s")
        stamp["project"] = built
    STAMP.write_text(json.dumps(stamp) + "\n")


def build_digest() -> str:
    """sha256 of the workdir's BUILD_FILES, each named, as they are now (an absent one counts as such)."""
    digest = hashlib.sha256()
    for name in BUILD_FILES:
        try:
            data = Path(name).read_bytes()
        except FileNotFoundError:
            data = None
        digest.update(f"{name} {len(data) if data is not None else -1}\n".encode() + (data or b""))
    return digest.hexdigest()


def hold_lock(path: Path) -> list[str] | None:
    """Take the exclusive flock on `path` for the rest of this process's life, our pid and host name
    written in it; None once held, else the words its holder wrote (none yet: []). Like
    procs.hold_lock, copied: this file runs as `python -c` on a host that may have no meshrun. The
    descriptor is not passed to pip, so the lock ends with this process, however it ends."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise SetupFailed(f"cannot open the setup lock {os.path.abspath(path)}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        words = os.read(fd, 320).decode(errors="replace").split()
        os.close(fd)
        return words
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    return None


def busy_error(holder: list[str]) -> str:
    """Who holds the lock, and what to do. Another host's name: the workdir is shared (an NFS home)."""
    pid = holder[0] if holder and holder[0].isdigit() and len(holder[0]) < 20 else ""
    if not pid:
        return "another fab setup is still running in this workdir; wait for it"
    if len(holder) > 1 and holder[1] != socket.gethostname():
        return (f"another fab setup is still running in this workdir, from {holder[1][:64]}, which shares it "
                f"(pid {pid} there); wait for it, or end it there")
    return f"another fab setup is still running on this host (pid {pid}); wait for it, or end it (kill {pid})"


# Agent locks tested at most (each is an open and a flock, slow on an NFS home): the newest.
LOCKS_CHECKED = 10_000


def newest_locks(paths: list[str], limit: int) -> list[str]:
    """The `limit` most recently written of `paths`, in name order. By mtime, not name: an agent
    writes its pid into its lock as it takes it, and a resumed run keeps its old (early) run id.
    The running runs are the newest; cutting by name kept the oldest and missed them."""
    if len(paths) <= limit:
        return sorted(paths)

    def written(path: str) -> float:
        try:
            return os.lstat(path).st_mtime
        except OSError:
            return -1.0

    return sorted(sorted(paths, key=lambda p: (written(p), p), reverse=True)[:limit])


def running_agents(pattern: str) -> list[tuple[str, str, str]]:
    """(run id, host, agent pid) of each agent lock matching `pattern` (relative to the workdir) that
    its agent holds: a lock this process cannot take, even shared. Read-only: opened without
    following a link or blocking on a FIFO, never written; only a regular file counts."""
    held = []
    for path in newest_locks(glob.glob(pattern), LOCKS_CHECKED):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                # Let go with the close below. An agent starting in that instant finds its lock taken
                # and refuses (exit 75): it would have run under this setup's pip otherwise.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                words = os.read(fd, 32).split()
                pid = words[0].decode() if words and words[0].isdigit() else "?"
                parts = Path(path).parts  # runs/<run id>/hosts/<host>/agent.lock
                held.append((_shown(parts[-4]), _shown(parts[-2]), pid))
        except OSError:
            continue
        finally:
            os.close(fd)
    return held


def _shown(name: str) -> str:
    return "".join(c for c in name if c.isprintable())[:100]


def runs_error(held: list[tuple[str, str, str]]) -> str:
    """The runs whose agents hold their locks in this workdir, and what to do."""
    runs = list(dict.fromkeys(run for run, _, _ in held))
    agents = ", ".join(f"pid {pid} on {host}" for _, host, pid in held[:8]) + (", ..." if len(held) > 8 else "")
    if len(runs) == 1:
        return (f"run {runs[0]} is running from this workdir (agent {agents}): setup would reinstall meshrun and "
                f"the project's requirements under it; stop it first (fab stop --run {runs[0]}) or wait for it to end")
    return (f"runs {', '.join(runs[:8])}{', ...' if len(runs) > 8 else ''} are running from this workdir (agents "
            f"{agents}): setup would reinstall meshrun and the project's requirements under them; stop them first "
            "(fab stop --run ID, for each) or wait for them to end")


def end_on_signal(signum: int, _frame: object) -> None:
    # SystemExit inside subprocess.run kills the running pip before it propagates: a setup ended
    # with `kill PID` leaves no pip behind to race the next one.
    raise SystemExit(128 + signum)


def torch_version() -> str | None:
    try:
        torch = subprocess.run([str(venv_python()), "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return torch.stdout.strip() if torch.returncode == 0 else None


def check_only(agent_locks: str | None) -> int:
    """Whether a run is running from this workdir, as setup's own test answers it: {"busy": false},
    or its {"error", "busy": true}. Takes no setup lock: a setup running here is setup's to refuse."""
    if agent_locks and (held := running_agents(agent_locks)):
        print(json.dumps({"error": runs_error(held), "busy": True}))
        return 1
    print(json.dumps({"busy": False}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="meshrun host setup")
    parser.add_argument("--wheel", help="the controller's meshrun wheel, pushed here")
    parser.add_argument("--build", help="its build (the digest check-network compares)")
    parser.add_argument("--reuse-site", default=None, help="interpreter whose packages the venv should also see")
    parser.add_argument("--requirements", default=None, help="the project's requirements file")
    parser.add_argument("--requirement", action="append", default=[], help="one requirement (from pyproject.toml)")
    parser.add_argument("--install-project", action="store_true", help="also the project itself: pip install -e .")
    parser.add_argument("--force", action="store_true", help="install again even if the stamp says done")
    parser.add_argument("--agent-locks", default=None, help="glob of the runs' agent locks, relative to the workdir")
    parser.add_argument("--check-only", action="store_true", help="only answer whether a run is running here")
    args = parser.parse_args()
    if args.check_only:
        return check_only(args.agent_locks)
    if not (args.wheel and args.build):
        parser.error("--wheel and --build are required, unless --check-only")
    actions: list[str] = []
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end_on_signal)
    try:
        if (holder := hold_lock(lock_file(Path.cwd()))) is not None:
            print(json.dumps({"error": busy_error(holder), "busy": True}))
            return 1
        if args.agent_locks and (held := running_agents(args.agent_locks)):
            print(json.dumps({"error": runs_error(held), "busy": True}))
            return 1
        make_venv(args.reuse_site, actions)
        install(args, actions)
    except (SetupFailed, subprocess.SubprocessError, OSError) as err:
        print(json.dumps({"error": str(err), "actions": actions}))
        return 1
    # The host's own home and workdir, resolved as `cd WORKDIR` left them (os.getcwd is the physical
    # path, as the python reported): the controller resolves the inventory's `~/` and relative `python:`.
    print(json.dumps({"actions": actions, "python": os.path.abspath(venv_python()), "torch": torch_version(),
                      "home": os.path.realpath(os.path.expanduser("~")), "workdir": os.getcwd()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
