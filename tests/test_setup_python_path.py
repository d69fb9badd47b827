"""`fab setup`'s warning to change the inventory's `python:`: only when it names another interpreter
than the venv setup made. Before, `python: ~/meshrun/.venv/bin/python` (the zerotier example, the
check's hint) or `.venv/bin/python` was compared as text with the host's absolute path, and every
setup warned to change a `python:` that was right. The host script's answer, from a real run of it
(its venv a stand-in), says the home and workdir the inventory's path is resolved with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.commands import setup
from meshrun.deploy.edges.wheel import Identity
from meshrun.deploy.project import Project
from meshrun.deploy.run.requirements import Requirements
from tests.fakesession import FakeSession, failure, host

HOME, WORKDIR, VENV = "/home/u", "/home/u/meshrun", "/home/u/meshrun/.venv/bin/python"


@pytest.mark.parametrize("configured,home,workdir,same", [
    ("~/meshrun/.venv/bin/python", HOME, WORKDIR, True),
    (".venv/bin/python", HOME, WORKDIR, True),
    ("./.venv/bin/python", HOME, WORKDIR, True),
    (VENV, HOME, WORKDIR, True),
    ("/home/u//meshrun/./.venv/bin/python", HOME, WORKDIR, True),
    ("~/other/.venv/bin/python", HOME, WORKDIR, False),
    ("/opt/venv/bin/python", HOME, WORKDIR, False),
    ("python3", HOME, WORKDIR, False),  # found on PATH, not in the workdir
    ("python", HOME, "/home/u/meshrun/.venv/bin", False),
    ("~u/meshrun/.venv/bin/python", HOME, WORKDIR, False),  # the shell quotes it: a folder named `~u`
    (None, HOME, WORKDIR, False),  # unset: the controller's own interpreter path
    ("~/meshrun/.venv/bin/python", None, None, False),  # a host that did not say: the text as it is
    ("~/meshrun/.venv/bin/python", "/", WORKDIR, False),
    ("~/home/u/meshrun/.venv/bin/python", "/", WORKDIR, True),
])
def test_the_inventory_python_resolved_as_the_host_runs_it(configured: str | None, home: str | None,
                                                            workdir: str | None, same: bool) -> None:
    assert setup.same_interpreter(configured, VENV, home=home, workdir=workdir) is same


SETUP = "host 'h1': the setup script gave an unexpected answer: "


@pytest.mark.parametrize("answer,message", [
    ('{"actions": [], "python": "/v/bin/python", "torch": null, "home": 5}', SETUP + "home is 5; expected text or null"),
    ('{"actions": [], "python": "/v/bin/python", "torch": null, "workdir": ["/"]}',
     SETUP + "workdir is ['/']; expected text or null"),
])
def test_home_and_workdir_are_shape_checked(answer: str, message: str) -> None:
    request = setup.SetupRequest("/usr/bin/python3", None, Path("meshrun-0.1.0-py3-none-any.whl"),
                                 Identity("0.1.0", "0123456789ab"), Requirements())
    assert failure(lambda: setup._run_setup(host(), FakeSession(answer), request, False)) == message


FAKE_PYTHON = "#!/bin/sh\ncase \"$1\" in -m) exit 0;; esac\necho 2.4.1\n"


def test_the_host_says_its_home_and_workdir_and_the_example_python_matches(tmp_path: Path) -> None:
    """HOME through a symlink, as on hosts whose /home links elsewhere: `cd ~/meshrun` leaves the
    physical path, which the venv's python is reported by, and the home is said the same way."""
    real_home = tmp_path / "data" / "u"
    workdir = real_home / "meshrun"
    (workdir / ".venv" / "bin").mkdir(parents=True)
    (workdir / ".venv" / "bin" / "python").write_text(FAKE_PYTHON)
    (workdir / ".venv" / "bin" / "python").chmod(0o755)
    (workdir / ".venv" / "bin" / "pip").write_text("")
    (tmp_path / "home").symlink_to(real_home)
    home = tmp_path / "home"
    request = setup.SetupRequest(sys.executable, None, Path("meshrun-0.1.0-py3-none-any.whl"),
                                 Identity("0.1.0", "0123456789ab"), Requirements())
    done = subprocess.run(setup.setup_argv(request), cwd=home / "meshrun", capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HOME": str(home)})
    said = json.loads(done.stdout)
    assert (said["python"], said["home"], said["workdir"]) == (
        f"{workdir}/.venv/bin/python", str(real_home), str(workdir))
    result = setup._run_setup(host(), FakeSession(done.stdout), request, False)
    assert (result.home, result.workdir) == (str(real_home), str(workdir))
    for configured in ("~/meshrun/.venv/bin/python", ".venv/bin/python"):
        assert setup.same_interpreter(configured, result.python, result.home, result.workdir), configured


def test_setup_no_longer_warns_about_the_examples_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  h1: {address: 10.147.17.11, python: ~/meshrun/.venv/bin/python}\n"
                         "  h2: {address: 10.147.17.12, python: /opt/torch/bin/python}\n")
    answers = {name: setup.SetupResult(name, (), VENV, "2.4.1", HOME, WORKDIR) for name in ("h1", "h2")}
    monkeypatch.setattr(setup, "controller_wheel", lambda: Path("meshrun-0.1.0-py3-none-any.whl"))
    monkeypatch.setattr(setup, "controller_identity", lambda: Identity("0.1.0", "0123456789ab"))
    monkeypatch.setattr(setup, "setup_hosts", lambda *_args: answers)  # the SSH part, tested on the cluster
    setup.main(str(inventory), None, "python3", None, Project(tmp_path, tmp_path / "runs"))
    shown = capsys.readouterr()
    warned = [line for line in (shown.out + shown.err).splitlines() if "set `python:" in line]
    assert warned == [f"warning: h2: the inventory's `python` is /opt/torch/bin/python; set `python: {VENV}` for it in "
                      f"{inventory} to train with this environment"]
