"""Helpers for tests that drive `fab` as a user would: a real subprocess in a project directory.

Tests never write into this repository's `runs/`: `ROOT` is a throw-away copy of the working tree
(its git-listed files, in a fresh git repository, as `fab sync` would see them) under the system's
temporary directory, made once per test session and removed at exit. `fab` run there imports the
copy's fabfile and records every run under the copy's `runs/`.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAB = [sys.executable, "-m", "fabric"]


def _project_copy() -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout
    root = Path(tempfile.mkdtemp(prefix="meshrun-test-project-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name in filter(None, listed.split(b"\0")):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            target = root / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


ROOT = _project_copy()
RUN_ID_RE = re.compile(r"^run (\d{8}-\d{6}-[0-9a-f]{4}): ", re.M)


def fab(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `fab ARGS` to completion in the project root."""
    return subprocess.run([*FAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class FabProcess:
    """`fab ARGS` running in its own process group; a thread collects its merged output."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([*FAB, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})}, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> str:
        """Block until the output from character `since` on matches `pattern`; returns the output so far."""
        regex = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if regex.search(self.output, since):
                return self.output
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no match for {pattern!r} within {timeout} s; output:\n{self.output[-3000:]}")

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float) -> int:
        """The exit status; fails with the output's tail (not a bare TimeoutExpired) if it hangs."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fab still running after {timeout} s; output:\n{self.output[-4000:]}") from None
        self.reader.join(timeout=5)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_id_of(output: str) -> str:
    match = RUN_ID_RE.search(output)
    assert match, f"no run id in output:\n{output[-2000:]}"
    return match.group(1)


def run_processes(run_id: str) -> list[int]:
    """Live (non-zombie) processes on this machine tagged with the run's id."""
    tag = f"MESHRUN_RUN_ID={run_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag in env and state != b"Z":
            pids.append(int(entry))
    return pids


def wait_no_run_processes(run_id: str, timeout: float) -> float:
    """Seconds until no process of the run is left; fails after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not run_processes(run_id):
            return time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"run {run_id} still has processes after {timeout} s: {run_processes(run_id)}")


def torchrun_envs(run_id: str) -> dict[str, dict[str, str]]:
    """MESHRUN_HOST -> the environment of that host's live torchrun (read from /proc: the namespaces
    share this machine's pid space), for the processes tagged with the run's id."""
    envs = {}
    for pid in run_processes(run_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        if b"meshrun.deploy.host.torchrun" in argv:  # torchrun as meshrun starts it
            env = dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
            envs[env["MESHRUN_HOST"]] = env
    return envs
