"""macOS's default soft limit of 256 open files is reached by a fan-out over about 60 hosts (an SSH
socket and a log per host, rsync's pipes while it syncs): every task raises it at the error boundary,
and a local tool that cannot start for want of file descriptors says so, not "install rsync"
(macos55 finding 8). A Mac's limit is simulated by each subprocess lowering its own."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys

from meshrun.deploy.edges.rsyncrun import cannot_start

_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
RAISED = 4096 if HARD == resource.RLIM_INFINITY else min(HARD, 4096)


def soft_limits(start: int, code: str) -> list[int]:
    """In a fresh python whose soft limit is `start`: `code` run, then the soft limit before and after."""
    program = ("import json, resource\n"
               "soft = lambda: resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
               f"resource.setrlimit(resource.RLIMIT_NOFILE, ({start}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
               "before = soft()\n"
               f"{code}\n"
               "print(json.dumps([before, soft()]))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_soft_limit_is_raised_from_macos_default() -> None:
    code = "from meshrun.deploy.cli import raise_open_files_limit; raise_open_files_limit()"
    assert soft_limits(256, code) == [256, RAISED]


def test_every_guarded_task_raises_it() -> None:
    code = "from meshrun.deploy.cli import guarded; guarded(lambda: None)()"
    assert soft_limits(256, code) == [256, RAISED]


def test_a_higher_soft_limit_is_never_lowered() -> None:
    higher = HARD if HARD != resource.RLIM_INFINITY else 8192
    code = "from meshrun.deploy.cli import raise_open_files_limit; raise_open_files_limit()"
    assert soft_limits(higher, code) == [higher, higher]


def test_out_of_file_descriptors_is_no_missing_rsync() -> None:
    said = [cannot_start("rsync", OSError(number, "why"), 256) for number in (errno.EMFILE, errno.ENFILE, errno.ENOENT)]
    fewer = "raise that limit, or give fewer hosts at once (--hosts)"
    assert said == [f"cannot run rsync here: too many open files on this machine (ulimit -n 256); {fewer}",
                    f"cannot run rsync here: too many open files on this machine (ulimit -n 256); {fewer}",
                    "cannot run rsync here (why); install rsync"]


def test_rsync_that_cannot_start_for_want_of_descriptors_says_so() -> None:
    """A real EMFILE: every descriptor of a process limited to 64 taken, then a sync started."""
    code = ("import os\n"
            "from meshrun.deploy.edges.rsyncrun import run_rsync\n"
            "from meshrun.deploy.errors import MeshrunError\n"
            "held = []\n"
            "try:\n"
            "    while True: held.append(os.open(os.devnull, os.O_RDONLY))\n"
            "except OSError: pass\n"
            "try: run_rsync(['rsync', 'a', 'b'], host='gpu1', what='code sync', timeout=10, hint='h')\n"
            "except MeshrunError as err: said = str(err)\n"
            "for fd in held: os.close(fd)\n"
            "print(said)")
    done = subprocess.run([sys.executable, "-c", "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, "
                           "(64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n" + code],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "host 'gpu1': code sync: cannot run rsync here: too many open files "
                                                 "on this machine (ulimit -n 64); raise that limit, or give fewer "
                                                 "hosts at once (--hosts)\n"), done.stderr
