"""Running a script as plain `python SCRIPT` and as torchrun starts it on a host
(`python -m meshrun.deploy.host.runscript SCRIPT ARGS...`), from the project directory, to compare
the two (tests/test_runscript.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = ("-m", "meshrun.deploy.host.runscript")


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def env() -> dict[str, str]:
    """The test's environment minus PYTHONUNBUFFERED: block-buffered stdout is the harder case."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"OMP_NUM_THREADS": "1"}


def argv(script: Path | str, *args: str, runner: bool) -> list[str]:  # python [-m meshrun.deploy.host.runscript] SCRIPT
    return [sys.executable, *(RUNNER if runner else ()), str(script), *args]


def run(script: Path | str, *args: str, runner: bool, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(script, *args, runner=runner), cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored, and python keeps an ignored SIGINT ignored:
    # under `tests/run &` the script would never see the Ctrl-C the test sends. torchrun's workers
    # inherit whatever their launcher had; the test wants python's own behaviour.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(script: Path, *args: str, runner: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(argv(script, *args, runner=runner), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def both(script: Path | str, *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    return run(script, *args, runner=False), run(script, *args, runner=True)
