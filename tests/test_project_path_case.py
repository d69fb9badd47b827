"""`--script Train.py` for the project's train.py (or `--config Mnist.yaml`) on a Mac (macos55 finding 7):
macOS's disk is case-insensitive, so `stat` and `resolve()` found the file and kept the typed case; the
hosts' Linux disks are not, and the run failed there (or in `refuse_unshipped`, as a file git does not
send). Now each component of the path is compared with the names its folder really holds.

This Linux disk is case-sensitive: `stat("Train.py")` finds nothing here, so relative_to_project says
"no such file" before the comparison. The comparison is tested with the names a Mac lists for such a
path (`real_case`), its listing on real folders (`wrong_case`: only the folders are read, which works
here too), and relative_to_project on real files only for exact names, which must still pass."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project, case_message, real_case, relative_to_project, wrong_case


def test_a_component_that_differs_only_in_case_is_given_its_real_name() -> None:
    assert real_case(PurePosixPath("Train.py"), [{"train.py", "data"}]) == PurePosixPath("train.py")
    assert real_case(PurePosixPath("Mnist.yaml"), [{"mnist.yaml"}]) == PurePosixPath("mnist.yaml")
    assert real_case(PurePosixPath("Experiments/TRAIN.py"), [{"experiments", "main.py"}, {"train.py"}]) == (
        PurePosixPath("experiments/train.py"))
    assert real_case(PurePosixPath("Experiments/train.py"), [{"experiments"}, {"train.py"}]) == (
        PurePosixPath("experiments/train.py"))


def test_exact_and_unknown_names_are_left_alone() -> None:
    assert real_case(PurePosixPath("experiments/train.py"), [{"experiments"}, {"train.py"}]) is None
    # A case-sensitive APFS volume may hold both: the exact one is the file meant.
    assert real_case(PurePosixPath("Train.py"), [{"train.py", "Train.py"}]) is None
    # A folder that could not be listed gives no names: nothing to compare with.
    assert real_case(PurePosixPath("Train.py"), [frozenset()]) is None
    assert real_case(PurePosixPath("Trainer.py"), [{"train.py"}]) is None


def test_the_refusal_names_the_flag_the_real_file_and_what_to_pass() -> None:
    assert case_message("--script", "Train.py", PurePosixPath("train.py")) == (
        "--script Train.py: the project's file is train.py (hosts' file systems are case-sensitive); "
        "pass --script train.py")
    assert case_message("--config", "Configs/Mnist.yaml", PurePosixPath("configs/mnist.yaml")) == (
        "--config Configs/Mnist.yaml: the project's file is configs/mnist.yaml (hosts' file systems are "
        "case-sensitive); pass --config configs/mnist.yaml")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = (tmp_path / "proj").resolve()
    (root / "experiments").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "experiments" / "train.py").write_text("print('experiment')\n")
    (root / "mnist.yaml").write_text("")
    return root


def test_the_names_are_read_from_the_folders_along_the_path(repo: Path) -> None:
    assert wrong_case(repo, Path("Train.py")) == PurePosixPath("train.py")
    assert wrong_case(repo, Path("experiments/Train.py")) == PurePosixPath("experiments/train.py")
    assert wrong_case(repo, Path("Mnist.yaml")) == PurePosixPath("mnist.yaml")
    assert wrong_case(repo, Path("experiments/train.py")) is None
    assert wrong_case(repo, Path("train.py")) is None


def test_exact_names_still_pass_and_a_wrong_case_is_missing_on_this_disk(repo: Path) -> None:
    project = Project(repo, repo / "runs")
    assert relative_to_project("train.py", project, "--script", cwd=repo) == "train.py"
    assert relative_to_project("experiments/train.py", project, "--script", cwd=repo) == "experiments/train.py"
    assert relative_to_project(str(repo / "train.py"), project, "--script", cwd=repo) == "train.py"
    assert relative_to_project("mnist.yaml", project, "--config", packaged_ok=True, cwd=repo) == "mnist.yaml"
    with pytest.raises(InputError) as refused:  # as on a host: Linux has no Train.py
        relative_to_project("Train.py", project, "--script", cwd=repo)
    assert str(refused.value) == f"--script Train.py: no such file in the project {repo}"
