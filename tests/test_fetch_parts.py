"""A fetch's two parts (every host's small files, then the checkpoints of a holder): what a failure
of the second part says. A local host's real tree and rsync; only the failure is a stand-in."""

from __future__ import annotations

from pathlib import Path

from meshrun.deploy.commands import fetch as fetch_cmd
from meshrun.deploy.commands.fetch import main
from meshrun.deploy.edges.fetch import ONLY_CHECKPOINTS
from meshrun.deploy.errors import MeshrunError
from tests.localrun import local_h2_project
from tests.test_fetch_prune import RUN, _trained_to


def test_a_holder_whose_checkpoints_fail_after_its_logs_came_is_named_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """The checkpoint part of h2 fails (the link dropped between the parts; an error is all a
    stand-in needs to give): exit 1, one line saying its logs came and its checkpoints did not."""
    real = fetch_cmd._Transfers.one

    def one(self, host, part, bars):  # type: ignore[no-untyped-def]
        if part == ONLY_CHECKPOINTS:
            raise MeshrunError(f"host '{host.name}': fetch failed: connection closed")
        return real(self, host, part, bars)
    monkeypatch.setattr(fetch_cmd._Transfers, "one", one)
    project = local_h2_project(tmp_path, RUN)
    _trained_to(tmp_path / "w2/runs" / RUN, [300])
    (tmp_path / "w2/runs" / RUN / "train.log").write_text("line\n")
    assert main(RUN, None, False, project) == 1
    err = capsys.readouterr().err
    assert "host 'h2': fetch failed: connection closed; its logs and metrics came home, its checkpoints did not" in err
    assert (project.runs / RUN / "hosts/h2/train.log").read_text() == "line\n"
