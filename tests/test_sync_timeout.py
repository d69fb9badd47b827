"""`fab sync --timeout SECONDS`: each host's code and data sync get that long (a first dataset over
a home uplink needs hours; the fixed 900 s cut every attempt), and a bad value is one line. The
rsyncs themselves are stood in to capture the deadline they were given: what they do with it is
tests/test_data_sync_hints.py's real transfer cut at its deadline."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.deploy.commands import sync as sync_cmd
from meshrun.deploy.edges.datasync import DataResult
from meshrun.deploy.edges.sync import SyncResult
from meshrun.deploy.project import Project
from tests.clirun import git_project, run_meshrun


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = git_project(tmp_path)
    (root / "train.py").write_text("print('hi')\n")
    (root / "hosts.yaml").write_text(f"hosts:\n  h1: {{address: local, workdir: {tmp_path / 'wd'}}}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"x")
    return Project(root, root / "runs")


def test_the_timeout_given_is_each_hosts_code_and_data_deadline(project: Project,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, float] = {}

    def code(host, root, known_hosts, files, progress, timeout, *, claim=None, python=None):  # type: ignore[no-untyped-def]
        given["code"] = timeout
        return SyncResult(host.name, False, 1)

    def data(host, session, python, spec, manifest, root, known_hosts, timeout, same=None):  # type: ignore[no-untyped-def]
        given["data"] = timeout
        return DataResult(host.name, 1, (), ())

    monkeypatch.setattr(sync_cmd, "sync_host", code)
    monkeypatch.setattr(sync_cmd, "sync_data", data)
    monkeypatch.setattr(sync_cmd, "refuse_under_runs", lambda sessions, runs=None: {})
    sync_cmd.main(str(project.root / "hosts.yaml"), None, f"{project.root.parent / 'data'}:data/d", project, 7200)
    assert 7190 < given["code"] <= 7200 and 7190 < given["data"] <= 7200  # less what was asked first
    sync_cmd.main(str(project.root / "hosts.yaml"), None, f"{project.root.parent / 'data'}:data/d", project)
    assert 890 < given["code"] <= sync_cmd.SYNC_TIMEOUT_S == 900 and 890 < given["data"] <= 900


@pytest.mark.parametrize("value, said", [
    ("0", "error: --timeout '0': need 1 <= TIMEOUT <= 604800\n"),
    ("ten", "error: --timeout 'ten': expected a whole number, e.g. --timeout 7200\n")])
def test_a_bad_timeout_is_one_line_before_any_host(project: Project, value: str, said: str) -> None:
    done = run_meshrun(project.root, "sync", "--inventory", "hosts.yaml", "--timeout", value)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", said)
    assert not (project.root.parent / "wd").exists()
