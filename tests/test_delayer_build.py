"""The test bed's delay line (tests/testbed/delayer.c) as a program: its argv, its compile (once,
no partial binary left, a compile error or a missing compiler reported before anything changes)
and its refusal of bad arguments. On real queues: tests/test_profiles.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import _testbed_unavailable
from tests.testbed import latency
from tests.testbed.layout import Host, StatePaths
from tests.testbed.requirements import missing_latency_requirements


def test_delayer_argv() -> None:
    argv = latency.delayer_argv(Path("/state/delayer-abc"), latency.lookup("home", loss=0.02), seed=3,
                                max_seconds=60)
    assert argv == ["/state/delayer-abc", "--queue", "1:20", "--queue", "2:40",
                    "--loss", "0.02", "--seed", "3", "--max-seconds", "60"]


def test_compile_argv() -> None:
    assert latency.compile_argv(Path("/src/delayer.c"), Path("/state/d"), "cc") == [
        "cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", "/state/d", "/src/delayer.c", "-lnetfilter_queue"]


@pytest.fixture
def compiler() -> None:
    missing = [m for m in missing_latency_requirements() if "iptables" not in m]
    if missing:
        _testbed_unavailable("; ".join(missing))


def test_the_delayer_compiles_once_and_refuses_bad_arguments(compiler: None, tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    binary = latency.build_delayer(paths)
    assert binary.parent == tmp_path and binary.name.startswith("delayer-")
    built = binary.stat().st_mtime_ns
    assert latency.build_delayer(paths) == binary and binary.stat().st_mtime_ns == built  # not rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == [binary.name]  # no partial left
    cases = {
        ("--queue", "1"): "expected --queue NUM:MS: 1",
        ("--queue", "x:20"): "expected --queue NUM:MS: x:20",
        ("--queue", "70000:5"): "expected --queue NUM:MS: 70000:5",
        ("--queue", "1:-5"): "delay must be 0..10000 ms: 1:-5",
        ("--queue", "1:20000"): "delay must be 0..10000 ms: 1:20000",
        ("--queue", "1:20", "--loss", "1"): "--loss must be in [0, 1): 1",
        ("--queue", "1:20", "--loss", "0.5x"): "--loss must be in [0, 1): 0.5x",
        ("--queue", "1:20", "--seed"): "missing value after: --seed",
        ("--queue", "1:20", "--port", "7"): "unknown option: --port",
        (): "at least one --queue is needed",
    }
    for argv, error in cases.items():
        result = subprocess.run([str(binary), *argv], capture_output=True, text=True, timeout=10)
        assert (result.returncode, result.stderr.splitlines()[0]) == (2, f"delayer: {error}"), argv


def test_a_compile_error_is_reported_and_leaves_no_binary(tmp_path: Path) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'delayer.c:1: error: boom' >&2\nexit 1\n")
    cc.chmod(0o755)
    paths = StatePaths(tmp_path / "state")
    with pytest.raises(RuntimeError, match=r"cannot compile .*delayer\.c: delayer\.c:1: error: boom"):
        latency.build_delayer(paths, str(cc))
    assert list(paths.root.iterdir()) == []


def test_a_machine_without_a_compiler_is_refused_before_anything_changes(tmp_path: Path) -> None:
    assert missing_latency_requirements("no-such-cc")[-1] == \
        "`no-such-cc` not found (apt-get install build-essential)"
    header = tmp_path / "libnetfilter_queue.h"
    assert missing_latency_requirements(header=header)[-1] == \
        f"{header} not found (apt-get install libnetfilter-queue-dev)"
    paths = StatePaths(tmp_path / "state")
    with pytest.raises(RuntimeError, match="cannot apply network profile far: .*no-such-cc"):
        latency.apply([Host(1)], paths, latency.lookup("far"), cc="no-such-cc")
    assert not paths.root.exists()
