"""A Ctrl-C while an attached `fab train` reads the hosts' answers after its job ended (result.json,
the comm record, provenance: seconds over a far link) still leaves `runs/<run_id>/summary.json`,
written from what the controller saw, and the Ctrl-C goes on to the error boundary (exit 130).

The job itself is replaced by its outcome (`train._watched`): what is under test is the gathering
after it, and the Ctrl-C is the host's answer (a fake session that raises KeyboardInterrupt where
the SSH read would be interrupted), which no real sshd can be made to time exactly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from meshrun.deploy.commands import train
from meshrun.deploy.edges.beside import Beside
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.idle import IdlePolicy
from meshrun.deploy.run.outcome import JobOutcome, JobStatus
from meshrun.deploy.host.notify import Sender
from meshrun.layout import SUMMARY
from tests.fakesession import FakeSession
from tests.test_hostile_answers import plan


def interrupted(_argv: object) -> str:
    raise KeyboardInterrupt


def test_a_ctrl_c_while_reading_results_still_writes_the_summary(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    the_plan = plan()
    outcome = JobOutcome("r1", JobStatus.SUCCEEDED, 100.0, 160.5, ())
    monkeypatch.setattr(train, "_watched", lambda *_args: (outcome, []))
    project = Project(tmp_path, tmp_path / "runs")
    record = RunRecord("r1", str(tmp_path / "hosts.yml"), ("h1",), 100.0, False, "h1:29400", "r1", None, {}, 1800,
                       None)
    err = io.StringIO()
    renderer = Renderer(Console(file=io.StringIO()), Console(file=err, width=300))
    origin = Beside(lambda: {})
    with pytest.raises(KeyboardInterrupt):
        train._run_attached(the_plan, record, None, {"h1": FakeSession(interrupted)}, project,  # type: ignore
                            renderer, origin, Sender((), renderer.warn), IdlePolicy())
    summary = json.loads((project.run_home("r1") / SUMMARY).read_text())
    assert (summary["run_id"], summary["status"], summary["hosts"], summary["duration_s"], summary["metrics"]) == (
        "r1", "succeeded", ["h1"], 60.5, {})
    assert "interrupted while reading the hosts' results" in err.getvalue()
    assert "fab fetch-checkpoints --run r1" in err.getvalue()
