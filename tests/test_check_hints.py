"""check-network's findings say their `fab TASK` hints as the user can run them: by the program
that runs and with its `--inventory` (deploy/render/hints.py), like every other line meshrun
prints; and the `python:` a FAIL suggests is one that resolves where commands run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from rich.console import Console

from meshrun.deploy.check.findings import Finding, Level
from meshrun.deploy.check.skew import meshrun_findings
from meshrun.deploy.check.verdicts import (AllReduceResult, Fingerprint, HostFacts, ProbeStatus, build_report,
                                           host_findings, venv_python)
from meshrun.deploy.check.exposure import with_findings
from meshrun.deploy.render import console
from meshrun.deploy.render.check import print_check
from meshrun.deploy.render.console import Renderer, repeat_in_hints
from meshrun.deploy.run.shell import remote_command

MESHRUN = str(Path(sys.executable).parent / "meshrun")
CONTROLLER = "0.1.0 (build 4bb96509cf88)"
PYTHON = Fingerprint("3.11.7", "2.14.1+cu130", "13.0", "2.30.7", meshrun="0.1.0 (build 0123456789ab)")


@pytest.fixture
def run_as(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Set the program's name and the flags it was given, as deploy/cli.guarded does; undone after."""
    def given(program: str, **flags: object) -> None:
        monkeypatch.setattr(sys, "argv", [f"/home/me/env/bin/{program}", "check-network"])
        repeat_in_hints(flags)

    yield given
    repeat_in_hints({})


def facts(name: str, **changes: object) -> HostFacts:
    base = dict(name=name, address=f"10.0.0.{name[-1]}", network="lan", reachable=True, ssh_ms=3.0,
                fingerprint=PYTHON, interface="eth0", mtu=1500, workdir="~/meshrun", disk_free_gib=50.0)
    return HostFacts(**{**base, **changes})  # type: ignore[arg-type]


def printed(hosts: tuple[HostFacts, ...]) -> list[str]:
    report = build_report(hosts, None, (), AllReduceResult(ProbeStatus.SKIPPED, "not run"), "lan", 1.0)
    report = with_findings(report, meshrun_findings(hosts, CONTROLLER))
    out = io.StringIO()
    print_check(Renderer(Console(file=out, width=400, highlight=False)), report)
    return out.getvalue().splitlines()


def test_a_skew_finding_names_the_program_and_repeats_the_inventory(run_as) -> None:
    run_as("meshrun", inventory="inventory/lab.yaml", hosts="gpu2")
    lines = printed((facts("gpu2"),))
    assert ("FAIL gpu2: version skew: the host runs meshrun 0.1.0 (build 0123456789ab), this controller "
            f"{CONTROLLER}; run `meshrun setup --inventory inventory/lab.yaml --hosts gpu2` (it installs this "
            f"controller's meshrun {CONTROLLER})") in lines


def test_the_hint_for_a_host_without_python_is_rewritten_like_the_others(run_as) -> None:
    """It was written `meshrun setup --hosts gpu1`, which neither `fab` nor `--inventory` rewrote."""
    unset = facts("gpu1", fingerprint=Fingerprint(None, error="no answer"), python_unset=True)
    run_as("fab", inventory="lab.yaml")
    assert ("FAIL gpu1: the host's python did not run (no answer); it has no `python:` in the inventory: run "
            "`fab setup --inventory lab.yaml --hosts gpu1` (it makes ~/meshrun/.venv), then set "
            "`python: ~/meshrun/.venv/bin/python`") in printed((unset,))
    # The pre-flight says its FAILs as an error, which goes through the same rewriting.
    run_as("meshrun")
    [finding] = host_findings(unset, {})
    assert console.as_run(finding.message).endswith(
        "run `meshrun setup --hosts gpu1` (it makes ~/meshrun/.venv), then set `python: ~/meshrun/.venv/bin/python`")


def test_an_unreachable_hosts_trust_hint_is_rewritten_in_its_table_and_its_finding(run_as) -> None:
    run_as("meshrun", inventory="lab.yaml")
    error = ("host 'h2': unknown SSH host key SHA256:abc (ssh-ed25519) for 10.0.0.2, not in inventory/known_hosts; "
             "if you trust it, run: fab trust --hosts h2")
    lines = printed((facts("h2", reachable=False, error=error, fingerprint=None),))
    rewritten = "run: meshrun trust --inventory lab.yaml --hosts h2"
    assert f"FAIL h2: {error.replace('run: fab trust --hosts h2', rewritten)}" in lines
    assert any(rewritten in line and line.lstrip("│ ").startswith("ssh") for line in lines), lines


def test_the_python_suggested_resolves_after_cd_to_a_relative_workdir(tmp_path: Path) -> None:
    """Every remote command is `cd WORKDIR && exec PYTHON …` run from the login directory: under a
    relative `workdir: meshrun` the venv's python is `.venv/bin/python`; the `meshrun/.venv/bin/python`
    once suggested is looked for in ~/meshrun/meshrun/ and does not exist."""
    assert venv_python("meshrun") == (".venv in the workdir meshrun", ".venv/bin/python")
    assert venv_python("~/meshrun/") == ("~/meshrun/.venv", "~/meshrun/.venv/bin/python")
    assert venv_python("/srv/job") == ("/srv/job/.venv", "/srv/job/.venv/bin/python")
    unset = facts("gpu1", fingerprint=Fingerprint(None, error="no answer"), python_unset=True, workdir="meshrun")
    [finding] = host_findings(unset, {})
    assert finding.message.endswith("(it makes .venv in the workdir meshrun), then set `python: .venv/bin/python`")

    venv = tmp_path / "meshrun" / ".venv" / "bin"  # tmp_path plays the login directory
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)

    def runs(python: str) -> subprocess.CompletedProcess[str]:
        command = remote_command("meshrun", [python, "-c", "print('ran')"])
        return subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)

    assert runs(venv_python("meshrun")[1]).stdout == "ran\n"
    assert runs("meshrun/.venv/bin/python").returncode == 127


def test_meshrun_check_network_prints_its_hints_for_meshrun_and_the_inventory(tmp_path: Path) -> None:
    """The command itself, on a local host whose python has no meshrun (nor torch): `-S`, no site-packages."""
    project = tmp_path / "proj"
    (project / "inventory").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    (project / "inventory" / "lab.yaml").write_text(f"hosts:\n  box:\n    address: local\n    python: {bare}\n"
                                                    "    workdir: .\n")
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"}
    done = subprocess.run([MESHRUN, "check-network", "--inventory", "inventory/lab.yaml", "--timeout", "5"],
                          cwd=project, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("FAIL box: meshrun is not installed for the host's python; run `meshrun setup --inventory "
            "inventory/lab.yaml --hosts box`") in done.stdout, done.stdout


def test_findings_without_hints_are_left_as_they_are(run_as) -> None:
    run_as("meshrun", inventory="lab.yaml")
    found = Finding(Level.WARN, "h1", "only 1.0 GiB free in ~/meshrun: checkpoints may not fit")
    assert console.as_run(found.message) == found.message
    lines = printed((facts("h1", disk_free_gib=1.0),))
    assert "WARN h1: only 1.0 GiB free in ~/meshrun: checkpoints may not fit" in lines
