"""Whether an attached run's controller still runs, where there is no /proc (macOS): its command
line is asked of `ps`, and judged by the same rule as /proc's (macos55 finding 3). Before, every
attached run's controller read as dead there: `fab status/logs/stop` refused 35 s after a start,
`fab join/leave` went behind a live `fab train`'s back and `fab train --resume` of a running run
was not refused.

A Mac is simulated on this Linux machine: `proc` points at an empty folder (no mounted /proc in
it), so the real `ps` answers about real child processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshrun.deploy.edges.localproc import command_words
from meshrun.deploy.edges.records import RunRecord, controller_alive, runs_fab_train

SLEEP = "import time; time.sleep(60)"


def test_the_rule_takes_fab_or_meshrun_with_train() -> None:
    lines = [
        ["/home/u/p/.venv/bin/python3", "/home/u/p/.venv/bin/fab", "train", "--hosts", "gpu1"],
        ["/usr/bin/python3", "-m", "meshrun", "train"],
        ["meshrun", "train", "--", "epochs=3"],
        ["/home/u/p/.venv/bin/python3", "/home/u/p/.venv/bin/fab", "status", "--watch"],
        ["/usr/bin/python3", "train.py"],
        ["sleep", "60"],
        [],
    ]
    assert [runs_fab_train(words) for words in lines] == [True, True, True, False, False, False, False]


@pytest.fixture
def children() -> Iterator[dict[str, subprocess.Popen]]:
    """A live process whose command line is a `fab train`'s, and one whose is a `fab status`'s."""
    started = {what: subprocess.Popen([sys.executable, "-c", SLEEP, "fab", what]) for what in ("train", "status")}
    yield started
    for child in started.values():
        child.kill()
        child.wait()


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass", "fab", "train"])
    child.wait()
    return child.pid


def attached(pid: int) -> RunRecord:
    return RunRecord("20261130-110000-bbbb", "/inv.yaml", ("gpu1",), 0.0, False, "10.0.0.1:29400",
                     controller_pid=pid)


def test_without_proc_ps_says_what_a_process_runs(tmp_path: Path, children: dict[str, subprocess.Popen]) -> None:
    """ps's words (its line split at whitespace), the same process read from /proc: one per argument."""
    pid = children["train"].pid
    assert command_words(pid, tmp_path) == [sys.executable, "-c", "import", "time;", "time.sleep(60)", "fab", "train"]
    assert command_words(pid) == [sys.executable, "-c", SLEEP, "fab", "train"]
    assert command_words(gone_pid(), tmp_path) == []


def test_without_proc_a_live_fab_train_is_alive_and_nothing_else_is(
        tmp_path: Path, children: dict[str, subprocess.Popen]) -> None:
    assert [controller_alive(attached(children[what].pid), tmp_path) for what in ("train", "status")] == [True, False]
    assert controller_alive(attached(gone_pid()), tmp_path) is False
    # With /proc, as before.
    assert [controller_alive(attached(children[what].pid)) for what in ("train", "status")] == [True, False]


def test_without_proc_or_ps_a_live_pid_counts_as_alive(tmp_path: Path, children: dict[str, subprocess.Popen],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No ps to ask (a PATH without it): any live pid is taken for the controller, the safe side (a
    live run judged dead would get a second controller behind its back); a gone one is dead."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert command_words(children["status"].pid, tmp_path) is None
    assert [controller_alive(attached(children[what].pid), tmp_path) for what in ("train", "status")] == [True, True]
    assert controller_alive(attached(gone_pid()), tmp_path) is False
