"""A long inventory path still gives one line of at most 300 characters, `error: ` included.

The path loses its middle (`…`), never its start, its file name or the `:line` after it; the rest of the
message is as for a short path. The cases use a relative path under a fresh directory, so every message is
exact text; one runs the real `meshrun`, one the real `fab` with an absolute path. Also: `--hosts` keeps a
control character in a name (only spaces around it are dropped), so `gpu1\\n` is refused like `gpu1\\n:0`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.cli import guarded
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.load import inventory_path, load_inventory
from meshrun.deploy.inventory.selection import HostSpec, parse_hosts_flag, select_hosts
from meshrun.deploy.inventory.yamlnodes import MAX_BYTES
from tests.fabrun import FAB, ROOT

LINE_MAX = 300  # characters of the printed line, `error: ` included
MESHRUN = str(Path(sys.executable).parent / "meshrun")
# 249 characters in five directories, as deep project trees or generated folders make them
LONG_DIR = "/".join(f"level{i}-" + "x" * 42 for i in range(5))
LONG = f"{LONG_DIR}/inv.yaml"
# LONG as messages show it: its first characters, `…`, then from the `/` before the last directory on
SHORT = f"level0-{'x' * 23}…/level4-{'x' * 42}/inv.yaml"
LOGIN = ("2: host 'a', field 'address': 'alice@10.0.0.1' holds a login name; put the login name in `user:` and "
         "only the host in `address:`")
INVENTORY = "hosts:\n" + "".join(f"  gpu{i}: {{address: 10.0.0.{i}, gpus: [0]}}\n" for i in (1, 2))


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path (relative paths give exact messages) with an empty home and ~/.ssh."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / LONG_DIR).mkdir(parents=True)
    return tmp_path


def load_error(path: Path | str) -> str:
    with pytest.raises(InputError) as info:
        load_inventory(Path(path))
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message and len("error: " + message) <= LINE_MAX, message
    return message


def test_the_long_path_is_as_long_as_the_report_said() -> None:
    assert (len(LONG_DIR), len(LONG), len(SHORT)) == (249, 258, 90)


@pytest.mark.parametrize("text,expected", [
    ("hosts:\n  a: {address: alice@10.0.0.1}\n", f":{LOGIN}"),
    ("hosts:\n  a: {address: 10.0.0.1\n",
     ":3: YAML syntax error: expected ',' or '}', but got '<stream end>'; fix the YAML at that line"),
    ("hosts:\n  a: {address: 10.0.0.1, identity: ~/.ssh/no_such_key}\n",
     ":2: host 'a', field 'identity': key file '~/.ssh/no_such_key' does not exist; create the key (ssh-keygen) "
     "or correct the path"),
    ("hosts:\n  a: {address: 10.0.0.1, port: 99999}\n",
     ":2: host 'a', field 'port': port 99999 is out of range; write a number from 1 to 65535"),
    ("hosts: {}\n", ":1: `hosts:` is empty; list at least one host"),
    ("hosts:\n  a: {address: 10.0.0.1}\n# \x07\n",
     ":3: control character U+0007 in the file; remove it (an inventory is plain text)"),
], ids=["field", "yaml", "identity", "port", "empty-hosts", "control-char"])
def test_long_path_keeps_file_name_and_line(text: str, expected: str) -> None:
    Path(LONG).write_text(text, encoding="utf-8")
    assert load_error(LONG) == SHORT + expected


def test_too_large_and_missing_files() -> None:
    Path(LONG).write_text("#" * (MAX_BYTES + 1))
    assert load_error(LONG) == (f"{SHORT}: larger than 1 MiB, too large for an inventory; check that --inventory "
                                "names the inventory")
    assert load_error(f"{LONG_DIR}/absent.yaml") == (
        f"level0-{'x' * 23}…/level4-{'x' * 42}/absent.yaml: inventory file not found; create it (examples in "
        "inventory/) or pass --inventory PATH / set MESHRUN_INVENTORY")


def test_long_file_name_keeps_its_end() -> None:
    """No `/` near the end: the file name itself loses its middle, and keeps its extension."""
    path = Path(LONG_DIR) / ("inventory-" + "y" * 200 + ".yaml")
    path.write_text("hosts:\n  a: {address: alice@10.0.0.1}\n")
    assert load_error(path) == f"level0-{'x' * 23}…{'y' * 84}.yaml:{LOGIN}"


def test_control_character_in_a_long_path_is_escaped_then_shortened() -> None:
    path = Path(LONG_DIR) / "a\x1b[2J" / "inv.yaml"
    path.parent.mkdir()
    path.write_text("hosts:\n  a: {address: alice@10.0.0.1}\n")
    assert load_error(path) == f"level0-{'x' * 23}…/level4-{'x' * 42}/a\\x1b[2J/inv.yaml:{LOGIN}"


def test_a_long_message_takes_room_from_the_path_not_the_line() -> None:
    """Long host names and values leave less room: the path shrinks further (to 40 characters at
    the least) before the end of the message would be cut."""
    name = "h" * 64
    Path(LONG).write_text(f"hosts:\n  {name}:\n    address: 10.0.0.1\n    env: {{'{'k' * 60}-': x}}\n")
    assert load_error(LONG) == (
        f"level0-{'x' * 12}…evel4-{'x' * 42}/inv.yaml:4: host '{'h' * 40}'…, field 'env.{'k' * 36}'…: "
        f"'{'k' * 40}'… is not a valid environment variable name; use letters, digits and _")


def test_unknown_host_with_a_long_path_and_long_names() -> None:
    """`--hosts` names an unknown host: the path is shortened and the list of known hosts bounded."""
    names = [f"node-{i:02d}-" + "n" * 50 for i in range(12)]
    Path(LONG).write_text("hosts:\n" + "".join(f"  {n}: {{address: 10.0.0.{i}}}\n" for i, n in enumerate(names)))
    inventory = load_inventory(Path(LONG))
    with pytest.raises(InputError) as info:
        select_hosts(inventory, "gpu1\n")
    assert str(info.value) == (f"--hosts: unknown host 'gpu1\\n' in {SHORT}; known hosts: "
                               f"{names[0][:40]}…, … (11 more)")
    assert len("error: " + str(info.value)) <= LINE_MAX


@pytest.mark.parametrize("flag", ["gpu1\n", "gpu1\r", "gpu1\t", "\tgpu1", "gpu1\x1b", "gpu1\x85", "gpu1\n:0"])
def test_hosts_flag_control_character_is_part_of_the_name(flag: str) -> None:
    """Only spaces around a name are dropped: `gpu1\\n` is not `gpu1` (it is refused like `gpu1\\n:0`)."""
    Path("inv.yaml").write_text(INVENTORY)
    name = flag.split(":")[0]
    with pytest.raises(InputError) as info:
        select_hosts(load_inventory(Path("inv.yaml")), flag)
    assert str(info.value) == f"--hosts: unknown host {name!r} in inv.yaml; known hosts: gpu1, gpu2"
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_hosts_flag_still_drops_spaces_and_blank_items() -> None:
    assert parse_hosts_flag(" gpu1 , gpu2:0 ,\n, ") == (HostSpec("gpu1"), HostSpec("gpu2", (0,)))
    assert parse_hosts_flag("gpu1\n") == (HostSpec("gpu1\n"),)


def test_no_inventory_under_a_long_project_root(tmp_path: Path) -> None:
    root = Path(LONG_DIR) / "project"
    with pytest.raises(InputError) as info:
        inventory_path(None, root, {}, tmp_path / "home")
    assert str(info.value) == (
        "no inventory found (looked for --inventory, $MESHRUN_INVENTORY, the project's inventory/hosts.yaml or "
        f"inventory/local.yaml, ~/.config/meshrun/inventory.yaml); write level0-{'x' * 12}…"
        "/project/inventory/hosts.yaml (README, \"Many machines\") or pass --inventory FILE")
    assert len("error: " + str(info.value)) <= LINE_MAX  # the cut falls at a `/`: the rest stays whole


def test_meshrun_prints_the_short_line(tmp_path: Path) -> None:
    """The real command, as the report ran it: one line, exit 2, no traceback."""
    Path(LONG).write_text("hosts:\n  a: {address: alice@10.0.0.1}\n")
    (tmp_path / "main.py").write_text("print('hi')\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"}
    done = subprocess.run([MESHRUN, "train", "--script", "main.py", "--inventory", LONG], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    line = f"error: {SHORT}:{LOGIN}"
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert len(line) == 226


@pytest.mark.parametrize("flags,expected", [
    ((), f"/inv.yaml:{LOGIN}"),
    (("--hosts", "gpu1\n"), None),
])
def test_fab_with_an_absolute_long_path(tmp_path: Path, flags: tuple[str, ...], expected: str | None) -> None:
    """The real `fab` (run from the project, so the path is absolute): the same line the loader gives, ending
    in the file name and line, at most 300 characters."""
    path = tmp_path / LONG
    path.write_text(INVENTORY if flags else "hosts:\n  a: {address: alice@10.0.0.1}\n")
    if expected is None:
        with pytest.raises(InputError) as info:
            select_hosts(load_inventory(path), "gpu1\n")
    else:
        with pytest.raises(InputError) as info:
            load_inventory(path)
    done = subprocess.run([*FAB, "check-network" if flags else "train", "--inventory", str(path), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {info.value}\n")
    assert len(done.stderr) - 1 <= LINE_MAX and str(path)[:20] in done.stderr and "…" in done.stderr
    if expected is not None:
        assert done.stderr.endswith(f"{expected}\n")
    else:
        assert done.stderr.endswith("/inv.yaml; known hosts: gpu1, gpu2\n")


def test_error_boundary_keeps_bad_input_to_one_short_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever formed an InputError's message, `guarded` prints one line of at most 300 characters;
    other errors are printed as they are."""
    from invoke.exceptions import Exit

    @guarded
    def task(error: MeshrunError) -> None:
        raise error

    with pytest.raises(Exit) as info:
        task(InputError("--flag " + "v" * 1000 + "\nsecond line"))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == "error: --flag " + "v" * 285 + "…\n" and len(err) == LINE_MAX + 1
    with pytest.raises(Exit):
        task(InputError("short\nmessage"))
    assert capsys.readouterr().err == "error: short\\nmessage\n"
    with pytest.raises(Exit) as info:
        task(MeshrunError("a failure " + "f" * 400))
    assert info.value.code == 1 and capsys.readouterr().err == "error: a failure " + "f" * 400 + "\n"
