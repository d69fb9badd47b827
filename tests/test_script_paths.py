"""`--script` and `--config` are relative to the project root, not to the current directory. Typed in
a subfolder, `train.py` meant the subfolder's file to the person and the root's to meshrun: it was
refused as missing though it lay right there, or, worse, the root's own train.py ran silently. Now
a relative path that names another project file from the current directory is refused, naming it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project, relative_to_project
from tests.clirun import git_project, run_meshrun


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = git_project(tmp_path, "my-research")
    (root / "experiments").mkdir()
    (root / "experiments/train.py").write_text("print('experiment')\n")
    (root / "experiments/exp.yaml").write_text("")
    (root / "main.py").write_text("")
    return root.resolve()


def _refusal(path: str, project: Project, flag: str, cwd: Path, packaged_ok: bool = False) -> str:
    with pytest.raises(InputError) as refused:
        relative_to_project(path, project, flag, packaged_ok, cwd)
    return str(refused.value)


def test_a_file_only_the_current_directory_has_is_named_from_the_root(repo: Path) -> None:
    project, here = Project(repo, repo / "runs"), repo / "experiments"
    assert _refusal("train.py", project, "--script", here) == (
        f"--script train.py: paths are relative to the project root {repo}, not the current directory; "
        "did you mean --script experiments/train.py?")
    # A way out of the folder that lands on a project file is the same mistake.
    assert _refusal("../main.py", project, "--script", here) == (
        f"--script ../main.py: paths are relative to the project root {repo}, not the current directory; "
        "did you mean --script main.py?")
    # A bare config name the root lacks was taken for one of meshrun's shipped configs.
    assert _refusal("exp.yaml", project, "--config", here, packaged_ok=True) == (
        f"--config exp.yaml: paths are relative to the project root {repo}, not the current directory; "
        "did you mean --config experiments/exp.yaml? (or run from the project root for meshrun's shipped exp.yaml)")


def test_a_name_both_the_root_and_the_current_directory_have_is_ambiguous(repo: Path) -> None:
    (repo / "train.py").write_text("print('root')\n")
    project, here = Project(repo, repo / "runs"), repo / "experiments"
    assert _refusal("train.py", project, "--script", here) == (
        f"--script train.py: ambiguous: paths are relative to the project root, so this is {repo / 'train.py'}, "
        "not experiments/train.py in the current directory; pass --script experiments/train.py for that one, "
        "or the absolute path for the root's")
    # Both ways out of it work from the subfolder; from the root the name is the root's.
    assert relative_to_project("experiments/train.py", project, "--script", cwd=here) == "experiments/train.py"
    assert relative_to_project(str(repo / "train.py"), project, "--script", cwd=here) == "train.py"
    assert relative_to_project("train.py", project, "--script", cwd=repo) == "train.py"


def test_what_the_current_directory_does_not_change(repo: Path, tmp_path: Path) -> None:
    project, here = Project(repo, repo / "runs"), repo / "experiments"
    (here / "main.py").symlink_to("../main.py")  # the same file by both names: nothing to tell apart
    assert relative_to_project("main.py", project, "--script", cwd=here) == "main.py"
    assert relative_to_project("digits.yaml", project, "--config", packaged_ok=True, cwd=here) == "digits.yaml"
    assert _refusal("nope.py", project, "--script", here) == f"--script nope.py: no such file in the project {repo}"
    (tmp_path / "outside.py").write_text("")  # the current directory outside the project: not the project's file
    assert _refusal("outside.py", project, "--script", tmp_path) == (
        f"--script outside.py: no such file in the project {repo}")
    (here / "sub").mkdir()  # a directory of that name is no file to mean
    assert _refusal("sub", project, "--script", here) == f"--script sub: no such file in the project {repo}"


def test_the_current_directory_is_the_default(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo / "experiments")
    with pytest.raises(InputError, match=r"did you mean --script experiments/train\.py\?$"):
        relative_to_project("train.py", Project(repo, repo / "runs"), "--script")


def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, "train", *args, ssh_config=None, stdin=None)


def test_the_real_command_from_a_subfolder(repo: Path) -> None:
    done = _train(repo / "experiments", "--script", "train.py")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: --script train.py: paths are relative to the project root {repo}, not the "
                           "current directory; did you mean --script experiments/train.py?\n")
    (repo / "train.py").write_text("print('root')\n")  # the root's train.py no longer runs in its place
    done = _train(repo / "experiments", "--script", "train.py")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: --script train.py: ambiguous: ")
    assert "relative to the project root" in " ".join(_train(repo, "--help").stdout.split())
