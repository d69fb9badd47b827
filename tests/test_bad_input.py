"""Bad input is one line, exit status 2, before any host is contacted (issue 20, item 4).

Flags are read by `deploy/run/flags.py` (exact messages below); the rest goes through the real `meshrun`
command in a throw-away project whose only reachable host is a listening socket the test owns (a trap):
no refused case may dial it, and two controls show that the same setup with good input does. Every case
failed before: a Python traceback (`--timeout abc`), an internal error (`--timeout inf`, an ssh_config
`Port abc`), a hang (a FIFO as the inventory), exit status 1 (invoke's own parse errors), or a refusal
only after the hosts were contacted (`-- epochs=abc`, `--timeout 0`, a bad ssh_config for another host).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.shown import with_path
from meshrun.deploy.run import flags
from meshrun.train.config import CONFIG_DIR
from tests.clirun import run_meshrun, trap_project
from tests.trap import dialled, listening_trap

TRAINER = CONFIG_DIR.parent


@pytest.mark.parametrize("text,expected", [
    ("abc", "--timeout 'abc': expected seconds, e.g. --timeout 10"),
    ("inf", "--timeout 'inf': expected seconds, e.g. --timeout 10"),
    ("nan", "--timeout 'nan': expected seconds, e.g. --timeout 10"),
    ("1e3", "--timeout '1e3': expected seconds, e.g. --timeout 10"),
    ("-1", "--timeout '-1': expected seconds, e.g. --timeout 10"),
    ("٣", "--timeout '٣': expected seconds, e.g. --timeout 10"),
    ("0", "--timeout '0': need 0 < SECONDS <= 600"),
    ("0.0", "--timeout '0.0': need 0 < SECONDS <= 600"),
    ("601", "--timeout '601': need 0 < SECONDS <= 600"),
    ("9" * 5000 + ".5", f"--timeout '{'9' * 40}'…: need 0 < SECONDS <= 600"),
])
def test_connect_timeout_flag(text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        flags.connect_timeout(text, 10.0)
    assert (str(info.value), info.value.exit_code) == (expected, 2)


@pytest.mark.parametrize("read,text,expected", [
    (flags.pg_timeout, "1.5", "--timeout '1.5': expected a whole number, e.g. --timeout 60"),
    (flags.pg_timeout, "0", "--timeout '0': need 1 <= TIMEOUT <= 86400"),
    (flags.pg_timeout, "86401", "--timeout '86401': need 1 <= TIMEOUT <= 86400"),
    (flags.pg_timeout, "9" * 30, f"--timeout '{'9' * 30}': need 1 <= TIMEOUT <= 86400"),
    (flags.pg_timeout, "9" * 5000, f"--timeout '{'9' * 40}'…: need 1 <= TIMEOUT <= 86400"),  # int() would refuse 4300+ digits
    (flags.log_lines, "abc", "--lines 'abc': expected a whole number, e.g. --lines 50"),
    (flags.log_lines, "-3", "--lines '-3': expected a whole number, e.g. --lines 50"),
    (flags.log_lines, "0", "--lines '0': need 1 <= LINES <= 100000"),
    (flags.log_lines, "²", "--lines '²': expected a whole number, e.g. --lines 50"),
])
def test_whole_number_flags(read, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as info:
        read(text, 60 if read is flags.pg_timeout else 50)
    assert str(info.value) == expected


def test_good_numbers_and_defaults() -> None:
    assert (flags.connect_timeout("", 10.0), flags.connect_timeout("2.5", 10.0), flags.connect_timeout(".5", 10.0),
            flags.connect_timeout("600", 10.0)) == (10.0, 2.5, 0.5, 600.0)
    assert (flags.pg_timeout("", 60), flags.pg_timeout("007", 60), flags.log_lines("1", 50)) == (60, 7, 1)


@pytest.mark.parametrize("text", ["", "-c", "--version", "python3\n", " python3", "py\x1bthon", "x" * 1001])
def test_host_program_flag(text: str) -> None:
    with pytest.raises(InputError) as info:
        flags.host_program("--base", text)
    assert str(info.value).startswith(f"--base {text[:40]!r}") and str(info.value).endswith(
        ": expected an interpreter on the hosts, e.g. --base python3.11 or --base /opt/conda/bin/python")


@pytest.fixture(scope="module")
def trap() -> Iterator[socket.socket]:
    """The port every host of the project's inventory leads to: any task that dials a host lands here."""
    yield from listening_trap()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, trap: socket.socket) -> Path:
    root, key, host = trap_project(tmp_path_factory.mktemp("bad-input"), trap.getsockname()[1])
    # gpu1 is the trap; gpu2 has no port of its own, so ssh_config's is used (a bad one in the cases below)
    (root / "two.yaml").write_text(f"hosts:\n  gpu1:\n{host}  gpu2: {{address: 127.0.0.9, identity: {key}}}\n")
    (root / "kh-fifo.yaml").write_text(f"hosts:\n  gpu1:\n{host}known_hosts: fifo\n")
    os.mkfifo(root / "fifo")
    (root / "ssh_config").write_text("Host 127.0.0.9\n  Port abc\n")
    (root / "a-file").write_text("not a directory\n")
    return root


LONG = "p" * 300
CASES = [
    (("check-network", "--timeout", "abc"), "--timeout 'abc': expected seconds, e.g. --timeout 10"),
    (("check-network", "--timeout", "inf"), "--timeout 'inf': expected seconds, e.g. --timeout 10"),
    (("trust", "--timeout", "0"), "--timeout '0': need 0 < SECONDS <= 600"),
    (("train", "--timeout", "-5"), "--timeout '-5': expected a whole number, e.g. --timeout 60"),
    (("logs", "--lines", "abc"), "--lines 'abc': expected a whole number, e.g. --lines 50"),
    (("logs", "--lines"), "--lines needs a value; see --help"),
    (("status", "--bogus"), "No idea what '--bogus' is; see --help"),
    (("setup", "--base", "-c"),
     "--base '-c': expected an interpreter on the hosts, e.g. --base python3.11 or --base /opt/conda/bin/python"),
    (("train", "--", "epochs=abc"), "the trainer refuses its arguments: override 'epochs=abc': 'epochs' must be an "
                                     "integer; got 'abc'; fix --config or the key=value overrides after --"),
    (("train", "--", "optim.lr=0"), "the trainer refuses its arguments: {trainer}/configs/digits.yaml with overrides: "
                                    "'optim.lr' must be > 0; got 0.0; fix --config or the key=value overrides after --"),
    (("train", "--config", "nosuch.yaml"), "the trainer refuses its arguments: config file nosuch.yaml not found; "
                                           "ship-in configs: cifar10_resnet18.yaml, cifar10_toy.yaml, digits.yaml, "
                                           "imagefolder_resnet.yaml, pointnet2_shapes.yaml; fix --config or the "
                                           "key=value overrides after --"),
    (("check-network", "--inventory", "fifo"), "fifo: is a FIFO, not a regular file; pass the inventory's YAML file"),
    (("check-network", "--inventory", "kh-fifo.yaml"), "kh-fifo.yaml:7: field 'known_hosts': 'fifo' is a FIFO, "
                                                       "not a regular file; point it at the file `meshrun trust "
                                                       "--inventory kh-fifo.yaml` "
                                                       "writes (it may not exist yet)"),
    (("train", "--inventory", "two.yaml"), "host 'gpu2': {root}/ssh_config: Port 'abc' for Host '127.0.0.9' is not a "
                                           "port number (1-65535); fix ssh_config or set it in the inventory"),
    (("train", "--every-checkpoint"), "--every-checkpoint adds notifications, and this run sends none: add --notify "
                                      "URL, or `notify:` to the inventory"),
    (("status", "--frames", "3"), "--frames counts the frames of --watch: add --watch, or leave --frames out"),
    (("train", "--resume", "../x"), "--resume '../x': not a run id (letters, digits, '.', '_', '-'; no '..'); list "
                                    "runs with `meshrun status`"),
    (("check-network", "--project", LONG), "{long_project}"),  # the path shortened in its middle (shown.with_path)
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a)[:40] for a, _ in CASES])
def test_the_real_command_refuses_in_one_line_and_dials_no_host(project: Path, trap: socket.socket,
                                                                 args: tuple[str, ...], expected: str) -> None:
    ssh_config = str(project / "ssh_config") if "two.yaml" in args else os.devnull
    done = run_meshrun(project, *args, ssh_config=ssh_config, stdin=None)
    long_project = with_path("--project ", project / LONG, ": file name too long; name another path")
    message = expected.format(root=project, trainer=TRAINER, long_project=long_project)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {message}\n")
    assert dialled(trap) == 0


def test_controls_good_input_does_dial_the_host(project: Path, trap: socket.socket) -> None:
    """The other side, so the cases above cannot pass by never dialling: good flags and overrides reach the
    host (the trap hangs up: the host is unreachable, exit status 1)."""
    dialled(trap)
    for args in (("check-network", "--timeout", "5"), ("train", "--skip-checks", "--timeout", "30", "--", "epochs=1")):
        done = run_meshrun(project, *args, stdin=None)
        assert done.returncode == 1 and dialled(trap) >= 1, (args, done.stdout[-500:], done.stderr[-500:])
