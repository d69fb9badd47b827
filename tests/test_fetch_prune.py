"""`fab fetch-checkpoints --prune`: home keeps what the hosts keep. Real files, a real rsync from a
local host's tree (tests/localrun.py); the rule itself is tests/test_fetchplan.py's."""

from __future__ import annotations

import hashlib
from pathlib import Path

from meshrun.deploy.commands.fetch import main
from meshrun.deploy.edges.placed import read_placed
from meshrun.deploy.run.manifest import manifest_text, parse_manifest
from tests.localrun import local_h2_project
from tests.test_fetch_partial import DEAD, LIVE, RUN as PARTIAL_RUN, _project

RUN = "20260101-000000-prun"


def _trained_to(run: Path, steps: list[int]) -> None:
    """The host's checkpoints folder as the trainer leaves it: the steps it keeps, best.pt, the manifest."""
    folder = run / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("ckpt-*"):
        old.unlink()
    files = {f"ckpt-step{s:09d}.pt": f"weights at {s}".encode() for s in steps}
    files["best.pt"] = f"best at {steps[-1]}".encode()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "MANIFEST.sha256").write_text(manifest_text({n: hashlib.sha256(d).hexdigest() for n, d in files.items()}))


def test_prune_removes_what_the_host_no_longer_keeps_and_nothing_you_changed(tmp_path: Path, capsys) -> None:
    project = local_h2_project(tmp_path, RUN)
    run = tmp_path / "w2/runs" / RUN
    home = project.runs / RUN
    _trained_to(run, [300, 400, 500])
    assert main(RUN, None, False, project) == 0
    _trained_to(run, [500, 600, 700])  # the trainer kept its last three
    (home / "checkpoints/ckpt-step000000400.pt").write_bytes(b"yours now")  # edited here: never removed
    assert main(RUN, None, False, project) == 0
    assert (home / "checkpoints/ckpt-step000000300.pt").exists()  # a fetch without --prune removes nothing
    capsys.readouterr()
    assert main(RUN, None, False, project, prune=True) == 0
    said = capsys.readouterr().out
    assert sorted(p.name for p in (home / "checkpoints").iterdir()) == [
        "MANIFEST.sha256", "best.pt", "ckpt-step000000400.pt", "ckpt-step000000500.pt", "ckpt-step000000600.pt",
        "ckpt-step000000700.pt"]
    assert (home / "checkpoints/ckpt-step000000400.pt").read_bytes() == b"yours now"
    listed = parse_manifest((home / "checkpoints/MANIFEST.sha256").read_bytes()).digests()
    assert sorted(listed) == ["best.pt", "ckpt-step000000500.pt", "ckpt-step000000600.pt", "ckpt-step000000700.pt"]
    assert sorted(p.name for p in (home / "hosts/h2/checkpoints").iterdir()) == [
        "MANIFEST.sha256", "best.pt", "ckpt-step000000500.pt", "ckpt-step000000600.pt", "ckpt-step000000700.pt"]
    record = read_placed(home, "h2")
    assert "checkpoints/ckpt-step000000300.pt" not in record and "checkpoints/ckpt-step000000700.pt" in record
    assert "prune: removed 3 checkpoint file(s) older than step 500, which the hosts no longer keep: " in said
    assert "checkpoints/ckpt-step000000300.pt" in said and "hosts/h2/checkpoints/ckpt-step000000400.pt" in said


def test_prune_through_a_folder_you_linked_elsewhere_removes_nothing_there(tmp_path: Path) -> None:
    project = local_h2_project(tmp_path, RUN)
    run = tmp_path / "w2/runs" / RUN
    home = project.runs / RUN
    _trained_to(run, [300])
    assert main(RUN, None, False, project) == 0
    elsewhere = tmp_path / "elsewhere"
    (home / "hosts/h2/checkpoints").rename(elsewhere)
    (home / "hosts/h2/checkpoints").symlink_to(elsewhere)
    _trained_to(run, [400])
    main(RUN, None, False, project, prune=True)
    assert (elsewhere / "ckpt-step000000300.pt").read_bytes() == b"weights at 300"


def test_prune_removes_nothing_while_a_host_of_the_run_does_not_answer(tmp_path: Path, capsys) -> None:
    """h3 is down and may keep older checkpoints than h2 lists (or h2 lies about what it keeps): nothing goes."""
    project = _project(tmp_path, LIVE + DEAD.replace("h1", "h3"), ("h2", "h3"))
    run = tmp_path / "w2/runs" / PARTIAL_RUN
    home = project.runs / PARTIAL_RUN
    _trained_to(run, [300, 400, 500])
    main(PARTIAL_RUN, None, False, project)
    _trained_to(run, [900])
    capsys.readouterr()
    assert main(PARTIAL_RUN, None, False, project, prune=True) == 1  # h3 not fetched
    assert "prune: nothing removed: h3 did not answer, and may keep older checkpoints" in capsys.readouterr().out
    assert (home / "checkpoints/ckpt-step000000300.pt").read_bytes() == b"weights at 300"
    assert (home / "hosts/h2/checkpoints/ckpt-step000000300.pt").read_bytes() == b"weights at 300"

