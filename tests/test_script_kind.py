"""user-script 7: `--script run.sh` (a wrapper that exports variables, then runs `python train.py`)
was accepted, then failed on every rank with a SyntaxError after the connect, sync and pre-flight.
It is refused here, before any host, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project, is_python_source, relative_to_project
from tests.clirun import git_project, run_meshrun

RUN_SH = b"#!/bin/bash\nexport OMP_NUM_THREADS=4\npython train.py --epochs 90 \"$@\"\n"


def refusal(path: str) -> str:
    return (f"--script {path}: meshrun runs a Python file under torchrun; put the environment in the inventory's "
            "`env:` and pass the Python script it runs (docs/scripts.md)")


def test_what_counts_as_a_python_file() -> None:
    python = [("train.py", b"import torch\n"), ("train.py", b""), ("train", b"#!/usr/bin/python3\n"),
              ("train.py", b"#!/usr/bin/env python3\n"), ("t.py", b"#!/usr/bin/python3.11 -u\n"),
              ("t.py", b"#! /usr/bin/env -S python3 -u\n"),
              ("t.py", b"#!/usr/bin/env -u HOME PYTHONHASHSEED=0 python\n"),
              ("t.py", b"#!/opt/pypy/bin/pypy3\n"), ("t.py", b"#!/usr/bin/env -S uv run --script\n")]
    assert [is_python_source(path, line) for path, line in python] == [True] * len(python)
    other = [("run.sh", b"python train.py\n"), ("RUN.SH", b""), ("go.bash", b"#!/usr/bin/env python3\n"),
             ("go.zsh", b""), ("run", b"#!/bin/bash\n"), ("run.py", b"#!/usr/bin/env bash\n"),
             ("run", b"#!/bin/sh -e\n"), ("run", b"#!\n")]
    assert [is_python_source(path, line) for path, line in other] == [False] * len(other)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return git_project(tmp_path)


def test_relative_to_project_refuses_a_shell_script_and_keeps_a_python_one(project: Path) -> None:
    (project / "run.sh").write_bytes(RUN_SH)
    (project / "launch").write_bytes(b"#!/bin/sh\nexec python train.py\n")
    (project / "train.py").write_bytes(b"#!/usr/bin/env python3\nprint(1)\n")
    proj = Project(project, project / "runs")
    for path in ("run.sh", "launch"):
        with pytest.raises(InputError) as err:
            relative_to_project(path, proj, "--script", cwd=project)
        assert (str(err.value), err.value.exit_code) == (refusal(path), 2)
    assert relative_to_project("train.py", proj, "--script", cwd=project) == "train.py"
    assert relative_to_project("run.sh", proj, "--config", cwd=project) == "run.sh"  # only --script runs as Python


def test_the_cli_refuses_run_sh_before_reading_any_inventory(project: Path) -> None:
    """No inventory exists: the refusal is the first thing meshrun says, so no host was looked up."""
    (project / "run.sh").write_bytes(RUN_SH)
    done = run_meshrun(project, "train", "--script", "run.sh", "--", "--epochs", "3")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {refusal('run.sh')}\n")
