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


def _checkpoint_part_fails(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = fetch_cmd._Transfers.one

    def one(self, host, part, bars):  # type: ignore[no-untyped-def]
        if part == ONLY_CHECKPOINTS:
            raise MeshrunError(f"host '{host.name}': fetch failed: connection closed")
        return real(self, host, part, bars)
    monkeypatch.setattr(fetch_cmd._Transfers, "one", one)


def test_a_checkpoint_missing_from_home_is_not_called_delivered_when_its_holder_fails(tmp_path: Path, monkeypatch,
                                                                                      capsys) -> None:
    """Step 300 is in hosts/h2/ but gone from the assembled checkpoints/ (deleted, or a fetch cut
    before the assembly); h2's checkpoint part then fails: exit 1 and its error, not a WARN that
    another host delivered everything (the review's case: the check after the loop counted h2's
    own tree as home, the loop did not)."""
    project = local_h2_project(tmp_path, RUN)
    _trained_to(tmp_path / "w2/runs" / RUN, [300])
    assert main(RUN, None, False, project) == 0
    (project.runs / RUN / "checkpoints/ckpt-step000000300.pt").unlink()
    _checkpoint_part_fails(monkeypatch)
    capsys.readouterr()
    assert main(RUN, None, False, project) == 1
    out = capsys.readouterr()
    assert "came from another host" not in out.out + out.err
    assert "its logs and metrics came home, its checkpoints did not" in out.err


def test_a_holder_whose_checkpoints_fail_after_its_logs_came_is_named_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """The checkpoint part of h2 fails (the link dropped between the parts; an error is all a
    stand-in needs to give): exit 1, one line saying its logs came and its checkpoints did not."""
    _checkpoint_part_fails(monkeypatch)
    project = local_h2_project(tmp_path, RUN)
    _trained_to(tmp_path / "w2/runs" / RUN, [300])
    (tmp_path / "w2/runs" / RUN / "train.log").write_text("line\n")
    assert main(RUN, None, False, project) == 1
    err = capsys.readouterr().err
    assert "host 'h2': fetch failed: connection closed; its logs and metrics came home, its checkpoints did not" in err
    assert (project.runs / RUN / "hosts/h2/train.log").read_text() == "line\n"
