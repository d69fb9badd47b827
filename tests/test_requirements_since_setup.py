"""A host set up before requirements.txt changed (finding user-script #5): `fab train` synced the new
file, passed (or reused) its pre-flight, and every rank died with ModuleNotFoundError, with no word
about setup. Each host's stamp now carries the requirements digest `fab setup` recorded in its venv
(deploy/host/stamp.py), and the pre-flight, reused or not, and check-network compare it with the
controller's (deploy/check/sincesetup.py) and WARN naming the hosts and `fab setup --hosts`.

Pure parts by exact equality. The edge tests run the real stamp program as a session runs it
(`VENV_PYTHON -c <stamp.py>` in the host's workdir, deploy/edges/transport.LocalSession), in a real
venv whose record the real host-side setup wrote (its pip stood in: nothing is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshrun.deploy.check import sincesetup
from meshrun.deploy.check.exposure import ExposureProbe
from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.sincesetup import behind, recorded, requirements_finding
from meshrun.deploy.check.verdicts import AllReduceResult, Fingerprint, HostFacts, ProbeStatus
from meshrun.deploy.commands import check
from meshrun.deploy.edges import check_probes
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.edges.wheel import controller_identity
from meshrun.deploy.host import setup as host_setup
from meshrun.deploy.host import stamp as host_stamp
from meshrun.deploy.inventory.model import Host, Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.project import Project
from meshrun.deploy.render import hints
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run import requirements
from meshrun.deploy.run.requirements import Declared, Requirements, declared, requirements_digest
from tests.fakesession import host

OLD = "torch\nnumpy\n"
NEW = OLD + "timm\n"  # a package added after setup
D_OLD, D_NEW = hashlib.sha256(OLD.encode()).hexdigest(), hashlib.sha256(NEW.encode()).hexdigest()
NOW = Declared(D_NEW, "requirements.txt")


def stamp_with(requirements: object) -> str:
    return json.dumps({"boot": "b", "gpus_busy": [], "requirements": requirements}, sort_keys=True)


def named(name: str, **changes: Any) -> Host:
    return dataclasses.replace(host(), **{"name": name, "address": f"10.9.0.{len(name)}", **changes})


# --- the record in a stamp: untrusted ---

@pytest.mark.parametrize(("stamp", "found"), [
    (stamp_with(D_OLD), D_OLD),
    (stamp_with(""), ""),  # setup ran when the project declared none
    (stamp_with(None), None),  # not the venv's python, or no record
    (json.dumps({"boot": "b"}), None),  # an older stamp
    (stamp_with(D_OLD.upper()), None),
    (stamp_with(D_OLD[:63]), None),
    (stamp_with(D_OLD + "\n"), None),
    (stamp_with(D_OLD + "0"), None),
    (stamp_with(64), None),
    (stamp_with([D_OLD]), None),
    (stamp_with("\x1b[2J" + D_OLD[4:]), None),
    ("[" + stamp_with(D_OLD) + "]", None),
    ("Welcome to gpu1!\n" + stamp_with(D_OLD), None),  # login noise: not exactly one object
    ("[" * 100_000, None),
    (stamp_with(D_OLD) + " " * 100_000, None),  # past STAMP_MAX
])
def test_a_record_is_64_hex_digits_or_empty_and_anything_else_is_none(stamp: str, found: str | None) -> None:
    assert recorded("gpu1", stamp) == found


# --- the comparison ---

def test_hosts_set_up_with_other_requirements_get_one_warn_naming_them_and_the_setup() -> None:
    hosts = (named("gpu1"), named("gpu2"), named("gpu3"), named("gpu4"), named("box", address="local"))
    stamps = {"gpu1": stamp_with(D_OLD), "gpu2": stamp_with(""), "gpu3": stamp_with(D_NEW),
              "gpu4": stamp_with(None), "box": stamp_with(D_OLD)}
    assert requirements_finding(hosts, stamps, NOW) == Finding(
        Level.WARN, "gpu1, gpu2",
        "requirements.txt changed since `fab setup` ran there; run `fab setup --hosts gpu1,gpu2`")
    lines = Declared(D_NEW, "pyproject.toml's dependencies")
    assert requirements_finding(hosts[:1], stamps, lines) == Finding(
        Level.WARN, "gpu1",
        "pyproject.toml's dependencies changed since `fab setup` ran there; run `fab setup --hosts gpu1`")


def test_no_record_no_stamp_a_local_host_or_nothing_declared_says_nothing() -> None:
    hosts = (named("gpu1"), named("gpu2"), named("box", address="local"))
    assert behind(hosts, {"gpu1": stamp_with(D_NEW), "gpu2": stamp_with(None), "box": stamp_with(D_OLD)}, NOW) == ()
    assert behind(hosts, {}, NOW) == ()  # no stamp at all (a failing nvidia-smi there)
    assert behind(hosts, {"gpu1": stamp_with(D_OLD)}, None) == ()  # the controller cannot tell its own
    assert behind(hosts, {"gpu1": stamp_with(D_OLD)}, Declared("", "requirements.txt")) == ()  # none declared now
    assert requirements_finding(hosts, {"gpu1": stamp_with(D_NEW)}, NOW) is None


def test_the_line_names_the_command_as_the_user_runs_it() -> None:
    finding = requirements_finding((named("gpu1"), named("gpu2")), {"gpu1": stamp_with(D_OLD),
                                                                    "gpu2": stamp_with(D_OLD)}, NOW)
    assert finding is not None
    line = f"pre-flight: {finding.where}: {finding.message}"
    assert hints.as_run(line, "meshrun", {"inventory": "lab.yaml"}) == (
        "pre-flight: gpu1, gpu2: requirements.txt changed since `meshrun setup --inventory lab.yaml` ran there; "
        "run `meshrun setup --inventory lab.yaml --hosts gpu1,gpu2`")


# --- the controller's digest is what the host's setup records ---

@pytest.mark.parametrize("requirements", [
    Requirements(file="requirements.txt"), Requirements(lines=("torch>=2.1", "numpy", "réseau")), Requirements()])
def test_the_controllers_digest_is_the_one_setup_records(tmp_path: Path, requirements: Requirements,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "requirements.txt").write_text(NEW)
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(requirements=requirements.file, requirement=list(requirements.lines))
    assert requirements_digest(requirements, NEW.encode()) == host_setup.requirements_digest(args)


def test_declared_reads_the_project_as_setup_does(tmp_path: Path) -> None:
    assert declared(tmp_path) == Declared("", "requirements.txt")  # nothing declared: no source needed
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\ndependencies = ["timm", "numpy"]\n')
    assert declared(tmp_path) == Declared(hashlib.sha256(b"timm\nnumpy").hexdigest(), "pyproject.toml's dependencies",
                                          requirements.build_digest(tmp_path))  # setup installs the project too
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\ndependencies = [\n')
    assert declared(tmp_path) is None  # invalid: the launch says nothing rather than fail over a warning
    (tmp_path / "requirements.txt").write_text(NEW)  # wins over pyproject.toml, as in setup
    assert declared(tmp_path) == NOW


def test_the_stamp_reads_setups_own_record_path() -> None:
    assert (host_stamp.VENV, host_stamp.SETUP_RECORD) == (str(host_setup.VENV), str(host_setup.STAMP))


# --- the real stamp, in a real venv, with the record the real host-side setup wrote ---

@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A host's workdir with a venv (no pip: nothing is installed) and the project synced as of setup."""
    where = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / ".venv")], check=True, timeout=120)
    (where / "requirements.txt").write_text(OLD)
    return where


def run_setup(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/host/setup.py's install in `workdir`, its pip stood in: it writes its record as it does."""
    args = argparse.Namespace(force=False, build="b1", wheel="w.whl", requirements="requirements.txt", requirement=[],
                              install_project=False)
    with monkeypatch.context() as here:
        here.chdir(workdir)
        here.setattr(host_setup, "pip", lambda *args: 0.0)
        host_setup.install(args, [])


class Recorder(Renderer):
    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def info(self, message: str) -> None:
        pass


STALE = ("pre-flight: gpu1: requirements.txt changed since `fab setup` ran there; run `fab setup --hosts gpu1`")


def test_a_reused_pre_flight_still_warns_of_requirements_changed_since_setup(
        workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text(OLD)
    run_setup(workdir, monkeypatch)
    gpu1 = named("gpu1", address="127.0.0.1", python=str(workdir / ".venv" / "bin" / "python"), workdir=str(workdir))
    selection = Selection((gpu1,), Rendezvous(None, 29400))
    sessions = {"gpu1": LocalSession(gpu1, project)}  # the probe's argv, run in the workdir as over SSH
    monkeypatch.setattr(check, "_check_before_run", lambda *args: ())
    cache = tmp_path / "preflight.json"

    def preflight() -> tuple[bool, list[str]]:
        shown = Recorder()
        return check.preflight(selection, sessions, shown, cache, root=project), shown.warnings

    assert [preflight(), preflight()] == [(False, []), (True, [])]  # set up with these: passed, then reused
    (project / "requirements.txt").write_text(NEW)  # the researcher adds timm
    assert preflight() == (True, [STALE])  # before: reused, and nothing said
    (workdir / "requirements.txt").write_text(NEW)  # the sync of `fab setup`, then its install
    run_setup(workdir, monkeypatch)
    assert preflight() == (False, [])  # a setup since is a new stamp: checked again, and nothing to say
    own = dataclasses.replace(gpu1, python=sys.executable)  # the host's own python: the venv's record is not its
    sessions = {"gpu1": LocalSession(own, project)}
    selection = Selection((own,), Rendezvous(None, 29400))
    (project / "requirements.txt").write_text(NEW + "einops\n")
    assert preflight()[1] == []


def test_check_network_warns_of_it_too(workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text(NEW)
    run_setup(workdir, monkeypatch)
    venv_python = workdir / ".venv" / "bin" / "python"
    (project / "hosts.yaml").write_text(f"hosts:\n  gpu1: {{address: 127.0.0.1, python: {venv_python}, "
                                        f"workdir: {workdir}}}\n")
    opened: dict[str, LocalSession] = {}

    def open_here(hosts: tuple[Host, ...], *args: object) -> tuple[dict, dict]:
        opened.update({h.name: LocalSession(h, project) for h in hosts})
        return opened, {}

    facts = HostFacts("gpu1", "127.0.0.1", "lan", True, fingerprint=Fingerprint(
        "3.11.9", "2.5.0", meshrun=str(controller_identity())), mtu=1500)
    monkeypatch.setattr(check, "open_sessions", open_here)
    monkeypatch.setattr(check, "gather_facts", lambda *args: (facts,))
    monkeypatch.setattr(check, "probe_network", lambda *args: check_probes.Probed(None, ()))
    monkeypatch.setattr(check, "probe_exposure", lambda *args: ExposureProbe())
    monkeypatch.setattr(check, "run_allreduce", lambda *args: AllReduceResult(ProbeStatus.SKIPPED, "stood in"))
    request = check.CheckRequest(str(project / "hosts.yaml"), None, json=True)
    check.check_network(request, Renderer(), Project(project, project / "runs"))
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f for f in findings if f["where"] == "gpu1" and "setup" in f["message"]] == [
        {"level": "WARN", "where": "gpu1", "message": sincesetup.requirements_finding(
            (named("gpu1"),), {"gpu1": stamp_with(D_OLD)}, NOW).message}]  # type: ignore[union-attr]


# --- the project itself: its build files since setup installed it (pip install --no-deps -e .) ---

B_OLD, B_NEW = "a" * 64, "b" * 64
BUILT = Declared("", "requirements.txt", B_NEW)


def stamp_of_project(project: object) -> str:
    return json.dumps({"boot": "b", "gpus_busy": [], "requirements": "", "project": project}, sort_keys=True)


def test_hosts_that_installed_the_project_from_other_build_files_get_one_warn() -> None:
    hosts = (named("gpu1"), named("gpu2"), named("gpu3"), named("gpu4"), named("box", address="local"))
    stamps = {"gpu1": stamp_of_project(B_OLD), "gpu2": stamp_of_project(B_NEW), "gpu3": stamp_of_project(None),
              "gpu4": stamp_of_project(B_OLD.upper()), "box": stamp_of_project(B_OLD)}
    assert sincesetup.since_setup(hosts, stamps, BUILT) == [Finding(
        Level.WARN, "gpu1", "the project's build files (pyproject.toml, setup.py, setup.cfg) changed since `fab setup` "
                            "installed the project there; run `fab setup --hosts gpu1`")]
    assert sincesetup.since_setup(hosts, stamps, dataclasses.replace(BUILT, build=None)) == []  # setup does not install it
    assert sincesetup.since_setup(hosts, stamps, None) == []
    both = sincesetup.since_setup(hosts[:1], {"gpu1": json.dumps({"requirements": D_OLD, "project": B_OLD})},
                                  Declared(D_NEW, "requirements.txt", B_NEW))
    assert [f.message.split(" changed")[0] for f in both] == [
        "requirements.txt", "the project's build files (pyproject.toml, setup.py, setup.cfg)"]


@pytest.mark.parametrize("files", [
    {}, {"pyproject.toml": b'[project]\nname = "p"\n'},
    {"pyproject.toml": b'[build-system]\nrequires = ["setuptools"]\n', "setup.cfg": b"[metadata]\nname = p\n",
     "setup.py": b"from setuptools import setup\nsetup()\n"}])
def test_the_controllers_build_digest_is_the_one_setup_records(tmp_path: Path, files: dict[str, bytes],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    assert requirements.build_digest(tmp_path) == host_setup.build_digest()
    assert requirements.BUILD_FILES == host_setup.BUILD_FILES


def test_declared_has_the_build_digest_only_where_setup_installs_the_project(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(NEW)
    assert declared(tmp_path) == NOW  # no setup.py, no [project] or [build-system]: not installed
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\n')
    assert declared(tmp_path) == dataclasses.replace(NOW, build=requirements.build_digest(tmp_path))


def test_a_reused_pre_flight_warns_of_build_files_changed_since_setup_installed_the_project(
        workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real stamp reads the record the real host-side setup wrote installing the project (its pip
    stood in); a console script added to pyproject.toml since is said, and a setup since silences it."""
    project = tmp_path / "project"
    project.mkdir()
    pyproject = '[project]\nname = "mypkg"\nversion = "0"\n'
    for where in (project, workdir):
        (where / "requirements.txt").write_text(OLD)
        (where / "pyproject.toml").write_text(pyproject)
    args = argparse.Namespace(force=False, build="b1", wheel="w.whl", requirements="requirements.txt", requirement=[],
                              install_project=True)

    def setup_there() -> None:
        with monkeypatch.context() as here:
            here.chdir(workdir)
            here.setattr(host_setup, "pip", lambda *args: 0.0)
            host_setup.install(args, [])

    setup_there()
    gpu1 = named("gpu1", address="127.0.0.1", python=str(workdir / ".venv" / "bin" / "python"), workdir=str(workdir))
    selection = Selection((gpu1,), Rendezvous(None, 29400))
    sessions = {"gpu1": LocalSession(gpu1, project)}
    monkeypatch.setattr(check, "_check_before_run", lambda *args: ())

    def warned() -> list[str]:
        shown = Recorder()
        check.preflight(selection, sessions, shown, tmp_path / "preflight.json", root=project)
        return shown.warnings

    assert warned() == []
    (project / "pyproject.toml").write_text(pyproject + '[project.scripts]\nmytool = "mypkg.cli:main"\n')
    assert warned() == ["pre-flight: gpu1: the project's build files (pyproject.toml, setup.py, setup.cfg) changed "
                        "since `fab setup` installed the project there; run `fab setup --hosts gpu1`"]
    (workdir / "pyproject.toml").write_bytes((project / "pyproject.toml").read_bytes())  # setup's sync, then its install
    setup_there()
    assert warned() == []
