"""An explicitly empty flag value is refused in one line, exit status 2, before any host is contacted
(bad-input finding 10).

`meshrun train --inventory "$LAB_INV" --resume "$RUN"` with the variables unset gave `""`, which the
tasks read as "not given": the project's own inventory (perhaps another cluster's) was used, and a fresh
run started from epoch 0, with no message. A text flag left out is now None, told apart from `""`.
The generic cases call each task's body, as invoke does, with one flag empty; the real `meshrun`
command shows the exit status and that no host is dialled (the only host is a listening socket the
test owns: tests/trap.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from meshrun.deploy import tasks
from tests.clirun import run_meshrun, trap_project
from tests.trap import dialled, listening_trap

TASKS = [getattr(tasks, name) for name in tasks.__all__]
TEXT_FLAGS = [(task, arg.attr_name or arg.name) for task in TASKS for arg in task.get_arguments()
              if arg.kind in (str, list)]


def test_every_text_flag_left_out_is_none_not_empty() -> None:
    """`""` as a default could not be told from `--flag ""`; `--base` alone has a real default."""
    defaults = {(task.name, arg.attr_name or arg.name): arg.default for task in TASKS
                for arg in task.get_arguments() if arg.kind is str}
    assert {key: value for key, value in defaults.items() if value is not None} == {("setup", "base"): "python3"}
    assert len(TEXT_FLAGS) > 40  # every task's flags were found, not none
    # Each says what to give instead: a flag added later gets its own words, not "give a value".
    assert {name for _, name in TEXT_FLAGS} <= set(tasks.EMPTY_FIX) | set(tasks.POSITIONAL)


@pytest.mark.parametrize("task,name", TEXT_FLAGS, ids=[f"{t.name}-{n}" for t, n in TEXT_FLAGS])
def test_each_text_flag_of_each_task_refuses_an_empty_value(task, name: str,  # type: ignore[no-untyped-def]
                                                             capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # not a git project: a flag that got through would stop there, not train here
    value: object = [""] if name == "notify" else ""
    with pytest.raises(Exit) as info:
        task.body(None, **{name: value})
    stderr = capsys.readouterr().err
    assert info.value.code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    flag = "firewall action" if name == "action" else f"--{name.replace('_', '-')}"
    assert stderr.startswith(f"error: {flag} '': empty; ") and stderr.rstrip().endswith(
        "or leave it out" if name == "action" else "or leave the flag out"), stderr


@pytest.mark.parametrize("name,line", [
    ("inventory", "--inventory '': empty; name the inventory file, or leave the flag out"),
    ("resume", "--resume '': empty; give the id of the run to resume, or leave the flag out"),
    ("config", "--config '': empty; name the trainer config, or leave the flag out"),
    ("script", "--script '': empty; name the script, or leave the flag out"),
    ("comm", "--comm '': empty; name the hook (or auto), or leave the flag out"),
    ("hosts", "--hosts '': empty; name hosts or groups, or leave the flag out"),
    ("project", "--project '': empty; name the project's folder, or leave the flag out"),
    ("runs_dir", "--runs-dir '': empty; name the folder of the runs, or leave the flag out"),
])
def test_the_exact_lines_of_trains_path_and_name_flags(name: str, line: str, capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exit):
        tasks.train.body(None, **{name: ""})
    assert capsys.readouterr().err == f"error: {line}\n"


def test_flags_left_out_still_reach_the_request_as_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshrun.deploy.commands import train

    seen: list = []
    monkeypatch.setattr(train, "main", lambda request, project: seen.append(request) or 0)
    monkeypatch.setattr(tasks, "remainder", lambda: ())
    monkeypatch.setattr(tasks, "_project", lambda project, runs_dir, writes=False: seen.append((project, runs_dir)))
    tasks.train.body(None)
    where, request = seen
    assert where == (None, None)
    assert (request.inventory, request.hosts, request.nnodes, request.resume, request.comm, request.pg_timeout_s,
            request.workload.script, request.workload.config, request.notify) == (None,) * 8 + ((),)


@pytest.fixture(scope="module")
def trap() -> Iterator[socket.socket]:
    yield from listening_trap()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, trap: socket.socket) -> Path:
    """A project whose own inventory leads to the trap: the fallback `--inventory ''` used to take."""
    return trap_project(tmp_path_factory.mktemp("empty-flags"), trap.getsockname()[1])[0]


@pytest.mark.parametrize("args,line", [
    (("check-network", "--inventory", ""), "--inventory '': empty; name the inventory file, or leave the flag out"),
    (("train", "--resume", ""), "--resume '': empty; give the id of the run to resume, or leave the flag out"),
    (("train", "--inventory=", "--skip-checks"), "--inventory '': empty; name the inventory file, or leave the flag "
                                                 "out"),
    (("firewall", ""), "firewall action '': empty; give up, down or status, or leave it out"),
    (("sync", "--hosts", ""), "--hosts '': empty; name hosts or groups, or leave the flag out"),
])
def test_the_real_command_refuses_and_dials_no_host(project: Path, trap: socket.socket, args: tuple[str, ...],
                                                    line: str) -> None:
    dialled(trap)
    done = run_meshrun(project, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {line}\n")
    assert dialled(trap) == 0


def test_control_the_same_command_without_the_empty_flag_does_dial(project: Path, trap: socket.socket) -> None:
    """So the cases above cannot pass by never dialling: the project's inventory leads to the trap."""
    dialled(trap)
    done = run_meshrun(project, "check-network", "--timeout", "5")
    assert done.returncode == 1 and dialled(trap) >= 1, (done.stdout[-500:], done.stderr[-500:])
