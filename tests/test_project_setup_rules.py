"""Issue 15's pure rules, by exact equality: which requirements a project declares for `fab
setup`, where the project and its runs are, which --script/--config paths reach the hosts, how a
host's meshrun compares with the controller's (version skew), and what a host may claim."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.skew import meshrun_findings
from meshrun.deploy.check.verdicts import Fingerprint, HostFacts
from meshrun.deploy.check.answers import meshrun_of
from meshrun.deploy.commands.train import TrainRequest, refuse_unshipped
from meshrun.deploy.edges.sync import project_files
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project, find_project, relative_to_project
from meshrun.deploy.run.plan import Workload
from meshrun.deploy.run.requirements import Requirements, project_requirements
from tests.clirun import git_project

MINE = "0.1.0 (build 0123456789ab)"


def test_requirements_txt_wins_then_pyproject_dependencies(tmp_path: Path) -> None:
    assert project_requirements(tmp_path) == Requirements()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\ndependencies = ["numpy>=1.24", "einops"]\n')
    assert project_requirements(tmp_path) == Requirements(lines=("numpy>=1.24", "einops"), install_project=True)
    (tmp_path / "requirements.txt").write_text("numpy\n")
    assert project_requirements(tmp_path) == Requirements(file="requirements.txt", install_project=True)


def test_the_project_itself_is_installed_when_pip_can_build_it(tmp_path: Path) -> None:
    """A setup.py, or a pyproject.toml with [project] or [build-system]: what `pip install -e .` builds.
    A pyproject.toml for tools alone ([tool.ruff]) is no package."""
    (tmp_path / "requirements.txt").write_text("numpy\n")
    assert project_requirements(tmp_path) == Requirements(file="requirements.txt")
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    assert project_requirements(tmp_path) == Requirements(file="requirements.txt")
    (tmp_path / "pyproject.toml").write_text("[project\n")  # unreadable: requirements.txt wins, nothing built
    assert project_requirements(tmp_path) == Requirements(file="requirements.txt")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    assert project_requirements(tmp_path) == Requirements(file="requirements.txt", install_project=True)
    (tmp_path / "requirements.txt").unlink()
    (tmp_path / "pyproject.toml").unlink()
    assert project_requirements(tmp_path) == Requirements(install_project=True)


def test_meshrun_as_its_own_project_adds_nothing_beyond_the_wheel(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "meshrun"\ndependencies = ["torch>=2.4"]\n')
    assert project_requirements(tmp_path) == Requirements()
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    assert project_requirements(tmp_path) == Requirements(install_project=True)  # a package, of no requirements


@pytest.mark.parametrize("text, message", [
    ("[project\n", "not valid TOML"),
    ('[project]\ndependencies = "numpy"\n', "[project].dependencies must be a list of requirement strings"),
    ("[project]\ndependencies = [1]\n", "[project].dependencies must be a list of requirement strings"),
])
def test_a_broken_pyproject_is_one_line_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(InputError) as err:
        project_requirements(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'pyproject.toml'}: ") and message in str(err.value)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = git_project(tmp_path, "repo").resolve()
    (root / "src/deep").mkdir(parents=True)
    (root / "main.py").write_text("")
    (root / "cfg.yaml").write_text("")
    return root


def test_the_project_is_found_from_a_subfolder_or_named(repo: Path, tmp_path: Path) -> None:
    assert find_project(None, None, repo / "src/deep") == Project(repo, repo / "runs")
    assert find_project(str(repo), "records", tmp_path) == Project(repo, (tmp_path / "records").resolve())
    assert find_project("repo", None, tmp_path) == Project(repo, repo / "runs")
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match=r"^--runs-dir .*afile: exists and is not a directory"):
        find_project(str(repo), "afile", tmp_path)


def test_script_and_config_paths_as_the_hosts_will_see_them(repo: Path, tmp_path: Path) -> None:
    project = Project(repo, repo / "runs")
    assert relative_to_project("main.py", project, "--script") == "main.py"
    assert relative_to_project(str(repo / "main.py"), project, "--script") == "main.py"
    assert relative_to_project("src/../main.py", project, "--script") == "main.py"
    assert relative_to_project("cifar10_toy.yaml", project, "--config", packaged_ok=True) == "cifar10_toy.yaml"
    assert relative_to_project("cfg.yaml", project, "--config", packaged_ok=True) == "cfg.yaml"
    with pytest.raises(InputError, match=r"^--script cifar10_toy.yaml: no such file in the project "):
        relative_to_project("cifar10_toy.yaml", project, "--script")
    with pytest.raises(InputError, match=r"^--config sub/x.yaml: no such file in the project "):
        relative_to_project("sub/x.yaml", project, "--config", packaged_ok=True)
    with pytest.raises(InputError, match=r"^--script \.\./x.py: not inside the project "):
        relative_to_project("../x.py", project, "--script")


def test_a_script_or_config_the_code_sync_leaves_out_is_refused_before_any_host(repo: Path) -> None:
    (repo / ".gitignore").write_text("secret.py\nlocal/\n")
    (repo / "secret.py").write_text("")
    (repo / "local").mkdir()
    (repo / "local/c.yaml").write_text("")
    project, files = Project(repo, repo / "runs"), project_files(repo)

    remote = Host("gpu1", "10.0.0.1", ssh_address=None, user=None, port=None, identity=None, python=None,
                  workdir="~/meshrun", network=Network.LAN, gpus=None, nproc=1, batch_size=None, env=())
    itself = dataclasses.replace(remote, name="local", address="local", workdir=str(repo))

    def refused(no_sync: bool = False, hosts: tuple[Host, ...] = (remote,), **work: str) -> str | None:
        request = TrainRequest(None, None, Workload(**work), no_sync=no_sync)  # type: ignore[arg-type]
        try:
            refuse_unshipped(request, files, project, hosts)
        except InputError as err:
            return str(err)
        return None

    assert refused(script="main.py", config="cfg.yaml") is None  # untracked, not ignored: shipped
    assert refused(config="digits.yaml") is None  # meshrun's own config, not the project's
    assert refused(script="secret.py") == ("--script secret.py: not among the files fab sync sends (gitignored or "
                                           "outside the project); commit it or un-ignore it")
    assert refused(config="local/c.yaml") == ("--config local/c.yaml: not among the files fab sync sends "
                                              "(gitignored or outside the project); commit it or un-ignore it")
    assert refused(no_sync=True, script="secret.py") is None  # --no-sync: the hosts have what they have
    assert refused(hosts=(itself,), script="secret.py") is None  # the local default: the workdir is the project


def facts(name: str, fingerprint: Fingerprint | None) -> HostFacts:
    return HostFacts(name=name, address="10.0.0.1", network="lan", reachable=True, fingerprint=fingerprint)


def test_version_skew_and_a_missing_meshrun_fail_naming_the_fix() -> None:
    hosts = (facts("a", Fingerprint("3.11.7", "2.14.1", meshrun=MINE)),
             facts("b", Fingerprint("3.11.7", "2.14.1", meshrun="0.1.0 (build ffffffffffff)")),
             facts("c", Fingerprint("3.11.7", "2.14.1", meshrun=None)),
             facts("d", Fingerprint(None, error="no such file")),
             facts("e", None))
    fix = f"run `fab setup --hosts {{}}` (it installs this controller's meshrun {MINE})"
    assert meshrun_findings(hosts, MINE) == [
        Finding(Level.FAIL, "b", f"version skew: the host runs meshrun 0.1.0 (build ffffffffffff), this controller "
                                 f"{MINE}; " + fix.format("b")),
        Finding(Level.FAIL, "c", "meshrun is not installed for the host's python; " + fix.format("c")
                + ", and point `python:` in the inventory at the venv it reports"),
    ]


@pytest.mark.parametrize("answer, shown", [
    ({"version": "0.1.0", "build": "0123456789ab"}, MINE),
    ({"version": "1.2.3rc1+local.7", "build": "ffffffffffff"}, "1.2.3rc1+local.7 (build ffffffffffff)"),
    (None, None), ("0.1.0", None), ([], None),
    ({"version": "\x1b[2J0.1.0", "build": "0123456789ab"}, "unreadable (build unknown)"),
    ({"version": "0.1.0", "build": "0123456789ab\n"}, "unreadable (build unknown)"),
    ({"version": "9" * 41, "build": "0123456789ab"}, "unreadable (build unknown)"),
    ({"version": 1, "build": "0123456789ab"}, "unreadable (build unknown)"),
    ({"version": "0.1.0"}, "unreadable (build unknown)"),
])
def test_what_a_host_claims_about_its_meshrun_is_shown_only_when_plain(answer: object, shown: str | None) -> None:
    assert meshrun_of(answer) == shown
