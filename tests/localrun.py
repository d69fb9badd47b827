"""A project whose one host, h2, is this machine (`address: local`, workdir w2), and a detached run
RUN recorded on it: the fetch tests' real rsync needs no sshd then."""

from __future__ import annotations

import time
from pathlib import Path

from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.project import Project


def local_h2_project(tmp_path: Path, run_id: str) -> Project:
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory/hosts.yaml").write_text("hosts:\n  h2:\n    address: local\n    nproc: 1\n    workdir: w2\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(run_id, str(tmp_path / "inventory/hosts.yaml"), ("h2",), time.time(), True, "h2:29500").save(project.runs)
    return project
