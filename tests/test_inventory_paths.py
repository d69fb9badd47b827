"""Paths an inventory names on this machine (issue 20, item 6): a relative `known_hosts:` or
`identity:` is read from the inventory's own folder (or, when only there, the project), never from
the shell's current directory; a local host's relative `workdir` stays inside the project. Pure
resolution by exact equality, then the real `meshrun` from a subfolder and from a nested project."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from meshrun.layout import SHIPPED_LIST
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.localpaths import controller_file, workdir_outside
from tests.clirun import git_project, run_meshrun


def files(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")


def test_a_relative_path_is_beside_the_inventory_else_in_the_project(tmp_path: Path, monkeypatch) -> None:
    project, home = tmp_path / "proj", tmp_path / "home"
    files(project, "conf/pins", "conf/both", "both", "inventory/known_hosts", "elsewhere/conf/pins")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project / "elsewhere")  # a cwd holding a decoy of the same relative name
    inventory = project / "conf" / "cluster.yaml"
    resolved = {value: controller_file(value, inventory, project) for value in (
        "pins", "both", "inventory/known_hosts", "missing/known_hosts", "~/.ssh/known_hosts", "/etc/ssh/pins")}
    assert resolved == {
        "pins": project / "conf" / "pins",  # beside the inventory
        "both": project / "conf" / "both",  # beside wins over the project's
        "inventory/known_hosts": project / "inventory" / "known_hosts",  # older inventories: the project root's
        "missing/known_hosts": project / "conf" / "missing" / "known_hosts",  # where `fab trust` will create it
        "~/.ssh/known_hosts": home / ".ssh" / "known_hosts",
        "/etc/ssh/pins": Path("/etc/ssh/pins"),
    }
    # A relative inventory path (`--inventory conf/x.yaml`) is the cwd's, as any command-line path.
    assert controller_file("pins", Path("conf/cluster.yaml"), None) == project / "elsewhere" / "conf" / "pins"


def test_loading_from_a_subfolder_finds_known_hosts_and_keys_beside_the_inventory(tmp_path: Path, monkeypatch) -> None:
    project = tmp_path / "proj"
    files(project, "conf/pins", "conf/keys/rented", "inventory/known_hosts")
    (project / "conf" / "cluster.yaml").write_text(
        "defaults: {identity: keys/rented}\nhosts:\n  gpu1: {address: 10.0.0.1}\nknown_hosts: pins\n")
    (project / "inventory" / "old.yaml").write_text("hosts:\n  gpu1: {address: 10.0.0.1}\n"
                                                    "known_hosts: inventory/known_hosts\n")
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    inv = load_inventory(project / "conf" / "cluster.yaml", project)
    assert (inv.known_hosts, inv.hosts[0].identity) == (project / "conf" / "pins", str(project / "conf/keys/rented"))
    assert load_inventory(project / "inventory" / "old.yaml", project).known_hosts == project / "inventory/known_hosts"
    (project / "conf" / "cluster.yaml").write_text("hosts:\n  gpu1: {address: 10.0.0.1, identity: keys/gone}\n")
    with pytest.raises(InputError) as refused:
        load_inventory(project / "conf" / "cluster.yaml", project)
    assert str(refused.value) == (f"{project}/conf/cluster.yaml:2: host 'gpu1', field 'identity': key file 'keys/gone' "
                                  "does not exist beside the inventory or in the project; create the key (ssh-keygen) "
                                  "or correct the path")


def test_which_local_workdirs_lead_out_of_the_project(tmp_path: Path) -> None:
    project = tmp_path / "a" / "b" / "proj"
    (project / "inside").mkdir(parents=True)
    (project / "out").symlink_to(tmp_path)  # a symlink in the project to a folder outside it
    (project / "in").symlink_to(project / "inside")
    workdirs = [".", "inside", "inside/../inside", "new/folder", "in", "..", "../../..", "inside/../..", "out",
                "out/x", "../proj", "~/meshrun", "/srv/work"]
    assert [w for w in workdirs if workdir_outside(w, project)] == ["..", "../../..", "inside/../..", "out", "out/x"]


def test_a_local_workdir_outside_the_project_is_one_line_at_its_line(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    inventory = project / "hosts.yaml"
    inventory.write_text("defaults:\n  workdir: ../../..\nhosts:\n  me: {address: local}\n  far: {address: 10.0.0.1}\n")
    with pytest.raises(InputError) as from_defaults:
        load_inventory(inventory, project)
    inventory.write_text("hosts:\n  me:\n    address: local\n    workdir: inside/../..\n")
    with pytest.raises(InputError) as own:
        load_inventory(inventory, project)
    why = "leads out of the project (a local host's relative workdir is in it); use `.` (the project itself), a " \
          "folder in it, or an absolute path"
    assert [str(from_defaults.value), str(own.value)] == [
        f"{inventory}:2: host 'me', field 'workdir': '../../..' {why}",
        f"{inventory}:4: host 'me', field 'workdir': 'inside/../..' {why}"]
    # A remote host's relative workdir is relative to its login home: not this machine's business.
    inventory.write_text("defaults:\n  workdir: ../../..\nhosts:\n  far: {address: 10.0.0.1}\n")
    assert load_inventory(inventory, project).hosts[0].workdir == "../../.."


def inventory_project(parent: Path, inventory: str) -> Path:
    """`parent/proj`, a git project with `train.py`, `sub/notes.txt` and `inventory` as its inventory/hosts.yaml."""
    root = git_project(parent)
    files(root, "train.py", "sub/notes.txt")
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yaml").write_text(inventory)
    return root


def meshrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_meshrun(cwd, *args, ssh_config=None, stdin=None)


def test_meshrun_sync_refuses_a_local_workdir_of_dot_dot_dot_dot_dot_dot(tmp_path: Path) -> None:
    """`../../..` from a project three folders down is tmp_path: the old loader let `sync` copy the
    project there. Now: one line, exit 2, nothing written outside the project."""
    project = inventory_project(tmp_path / "a" / "b", "hosts:\n  me:\n    address: local\n    workdir: ../../..\n")
    done = meshrun("sync", cwd=project / "sub")
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr == (f"error: {project}/inventory/hosts.yaml:4: host 'me', field 'workdir': '../../..' leads "
                           "out of the project (a local host's relative workdir is in it); use `.` (the project "
                           "itself), a folder in it, or an absolute path\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_meshrun_sync_from_a_subfolder_keeps_the_inventorys_own_files_home(tmp_path: Path) -> None:
    """From `sub/`, the inventory's relative `known_hosts:` and `identity:` (names no rule would keep
    home) are found, beside the inventory or (an older inventory's `conf/pins`) in the project: they
    stay home, everything else ships. The old loader read them from the cwd: it refused the key as
    missing (and with no key it shipped the pinned host keys)."""
    project = inventory_project(tmp_path, "")
    files(project, "conf/pins", "conf/keys/rented")
    (project / ".gitignore").write_text("shipped*/\n")
    for n, inventory in enumerate((
            "hosts:\n  me: {address: local, workdir: shipped1, identity: keys/rented}\nknown_hosts: pins\n",
            "hosts:\n  me: {address: local, workdir: shipped2, identity: conf/keys/rented}\nknown_hosts: conf/pins\n"), 1):
        (project / "conf" / "cluster.yaml").write_text(inventory)
        done = meshrun("sync", "--inventory", "../conf/cluster.yaml", cwd=project / "sub")
        assert done.returncode == 0, done.stdout + done.stderr
        shipped = project / f"shipped{n}"
        assert sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file()) == [
            ".gitignore", SHIPPED_LIST, "sub/notes.txt", "train.py"]  # and the sync's record of what it sent
