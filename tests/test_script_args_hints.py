"""user-script 6: a script argument typed as a path from a subfolder (`cd experiments; ... -- --config
configs/exp1.yaml`) names nothing where the ranks run (the project root), and every rank failed with
FileNotFoundError after the connect, sync and pre-flight. meshrun warns before any host (a warning:
`--data` may put such a path on the hosts)."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

import pytest

from meshrun.deploy.project import Project, arg_path_warnings, path_words, script_arg_warnings
from tests.clirun import git_project, run_meshrun

EXP = PurePosixPath("experiments")


def warning(word: str, shown: str) -> str:
    return (f"script argument {word}: the ranks run in the project root, where it does not exist; "
            f"from here it is {shown}")


def test_the_words_that_may_be_paths() -> None:
    args = ("--config", "configs/exp1.yaml", "--out=runs/a", "-o=x", "data.path=d/train", "--flag", "-v", "",
            "/abs/path", "~/data", "--root=/abs", "configs/exp1.yaml", "3")
    assert path_words(args) == ("configs/exp1.yaml", "runs/a", "x", "data.path=d/train", "d/train", "3")


def test_only_a_path_found_here_and_not_at_the_root_is_warned_of() -> None:
    words = ("configs/exp1.yaml", "shared.yaml", "./out", "../data/x", "../../elsewhere", "missing")
    found_here = frozenset({"configs/exp1.yaml", "shared.yaml", "./out", "../data/x", "../../elsewhere"})
    found_at_root = frozenset({"shared.yaml"})
    assert arg_path_warnings(words, EXP, found_here, found_at_root) == (
        warning("configs/exp1.yaml", "experiments/configs/exp1.yaml"),
        warning("./out", "experiments/out"),
        warning("../data/x", "data/x"))  # ../../elsewhere is outside the project: no project path to give
    assert arg_path_warnings(words, EXP, frozenset(), found_at_root) == ()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = git_project(tmp_path)
    (root / "experiments/configs").mkdir(parents=True)
    (root / "experiments/train.py").write_text("")
    (root / "experiments/configs/exp1.yaml").write_text("")
    (root / "data").mkdir()
    return root


def test_the_facts_are_read_from_the_disk_here(project: Path) -> None:
    proj = Project(project, project / "runs")
    args = ("--config", "configs/exp1.yaml", "--data=../data", "configs", "experiments/train.py", "--out", "data")
    assert script_arg_warnings(args, proj, project / "experiments") == (
        warning("configs/exp1.yaml", "experiments/configs/exp1.yaml"), warning("../data", "data"),
        warning("configs", "experiments/configs"))  # experiments/train.py and data: the root's, as typed
    assert script_arg_warnings(args, proj, project) == ()  # typed at the root: they mean what the ranks see
    assert script_arg_warnings(args, proj, project.parent) == ()  # outside the project: --project was given


def meshrun(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, *args, env={"HOME": str(cwd)})


def test_train_from_a_subfolder_warns_before_any_host(project: Path) -> None:
    """No inventory exists, so meshrun stops at looking for one: the warning came before any host."""
    done = meshrun(project / "experiments", "train", "--script", "experiments/train.py", "--", "--config",
                   "configs/exp1.yaml")
    lines = done.stderr.splitlines()
    shown = warning("configs/exp1.yaml", "experiments/configs/exp1.yaml")
    assert (done.returncode, lines[0]) == (2, f"warning: {shown}")
    assert len(lines) == 2 and lines[1].startswith("error: no inventory found")
    done = meshrun(project, "train", "--script", "experiments/train.py", "--", "--config", "configs/exp1.yaml")
    assert (done.returncode, done.stderr.startswith("error: no inventory found")) == (2, True)
    # The trainer's overrides are not a script's arguments.
    done = meshrun(project / "experiments", "train", "--", "configs/exp1.yaml")
    assert not done.stderr.startswith("warning:")
