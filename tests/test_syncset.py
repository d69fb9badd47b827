"""`fab sync`'s rule for what stays home (issue 12, hole 4): pure, by exact equality."""

from __future__ import annotations

import subprocess

import pytest

from meshrun.deploy.commands.sync import code_files
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.project import Project
from meshrun.deploy.run.syncset import is_private, shippable

HOME = ["inventory/mine.yaml", "inventory/local.yaml", "inventory/prod.yml", "inventory/sub/x.yaml", "known_hosts",
        "inventory/known_hosts", "known_hosts.old", "keys/id_ed25519", "id_rsa", "id_ed25519.pub", "id_rsa_work",
        "certs/server.pem", "tls.key", "runs/20261130-000000-abcd/launch.json", "runs/x/checkpoints/ckpt.pt"]
SHIPPED = ["inventory/lan.example.yaml", "inventory/README.md", "deploy/host/agent.py", "train/ids.py",
           "id_map.py", "mine.yaml", "config/mine.yaml", "docs/known_hosts.md.txt", "keyboard.py", "a.keys",
           "inventory.yaml", "tests/x/inventory/mine.yaml", "runs.py", "src/runs/x.py"]


def test_inventories_and_key_files_stay_home() -> None:
    assert [n for n in HOME if not is_private(n)] == []


def test_code_docs_and_example_inventories_ship() -> None:
    assert [n for n in SHIPPED if is_private(n)] == ["docs/known_hosts.md.txt"]


def test_files_in_use_stay_home_wherever_they_lie() -> None:
    names = ["conf/cluster.yaml", "conf/hosts.txt", "train/x.py", "inventory/lan.example.yaml"]
    assert shippable(names, frozenset({"conf/cluster.yaml", "conf/hosts.txt", "inventory/lan.example.yaml"})) == [
        "train/x.py"]


def test_the_dataset_goes_beside_the_code_only_where_they_cannot_touch_the_same_path() -> None:
    from meshrun.deploy.run.syncset import data_beside_code

    files = b"\0".join([b"train.py", b"data/README.md", b"conf/a.yaml", b"notes"])
    assert data_beside_code("data/p4", files)
    assert data_beside_code("./datasets/x/", files)
    assert not data_beside_code("data", files)  # data/README.md is the code sync's
    assert not data_beside_code("conf/a.yaml/x", files)  # a project file where a folder must be
    assert not data_beside_code("notes", files)
    assert not data_beside_code("/srv/data", files) and not data_beside_code("~/data", files)
    assert not data_beside_code(".", files) and not data_beside_code("../elsewhere", files)


def test_a_host_can_only_ask_for_files_the_manifest_lists() -> None:
    """The data sync resends what a host says fails verification: a hostile answer naming other
    files (a key outside the dataset, escapes for the terminal) is dropped, not sent or printed."""
    from meshrun.deploy.edges.datasync import listed_only

    manifest = {"a/1.bin": "00" * 32, "b.bin": "11" * 32}
    answer = ["b.bin", "../../.ssh/id_ed25519", "/etc/shadow", "\x1b[2Jx", 7, None, ["a/1.bin"], "b.bin", "a/1.bin"]
    assert listed_only(answer, manifest) == ("b.bin", "a/1.bin")


def test_the_inventory_in_use_its_known_hosts_and_every_identity_stay_home(tmp_path) -> None:
    """From the inventory to the file list rsync gets (deploy/commands/sync.code_files), in a real git
    project: files whose names say nothing private are left out because the inventory uses them."""
    for name, text in {"train.py": "print()\n", "keys/rented": "PRIVATE KEY\n", "conf/pins": "",
                       "conf/cluster.yaml": f"hosts:\n  gpu1: {{address: 10.0.0.1, identity: {tmp_path}/keys/rented}}\n"
                                            f"known_hosts: {tmp_path}/conf/pins\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "train.py", "keys/rented"], cwd=tmp_path, check=True)  # tracked or not
    inventory = load_inventory(tmp_path / "conf" / "cluster.yaml")
    assert code_files(inventory, Project(tmp_path, tmp_path / "runs")).split(b"\0") == [b"train.py", b""]


def test_case_and_editor_backups_do_not_let_a_private_file_ship() -> None:
    """Issue 20, item 6: `HOSTS.YAML`, `hosts.yaml~` and friends hold the same text as the file they
    copy, so they stay home with it; a backup of a file that ships still ships."""
    home = ["inventory/HOSTS.YAML", "inventory/Hosts.Yml", "Inventory/hosts.yaml", "inventory/hosts.yaml~",
            "inventory/.hosts.yaml.swp", "inventory/.hosts.yaml.swo", "inventory/hosts.yaml.bak",
            "inventory/hosts.yaml.orig", "inventory/#hosts.yaml#", "inventory/.#hosts.yaml", "inventory/hosts.yaml.~2~",
            "inventory/hosts.yaml.bak~", "inventory/hosts.yaml.save", "inventory/hosts.yaml.new",
            "inventory.bak/hosts.yaml", "id_ed25519.BAK", "ID_RSA", "keys/Id_Ed25519.pub~", "keys/.id_rsa.swp",
            "KNOWN_HOSTS", "known_hosts.orig", "#known_hosts#", "certs/server.PEM", "tls.Key.bak", "RUNS/x/launch.json",
            "runs.old/x/summary.json"]
    ships = ["inventory/lan.example.yaml~", "inventory/LAN.EXAMPLE.YAML", "inventory/README.md",
             "inventory/notes.txt.bak", "train.py~", ".train.py.swp", "#train.py#", "config/mine.yaml.bak",
             "id_map.py.orig", "ID_MAP.PY", "models/backbone.old", "~", "#", ".bak", "a.swp"]
    assert [n for n in home if not is_private(n)] == []
    assert [n for n in ships if is_private(n)] == []


def test_the_files_in_use_stay_home_whatever_their_case_and_with_their_backups() -> None:
    named = frozenset({"conf/cluster.yaml", "keys/rented", "conf/pins"})
    names = ["conf/cluster.yaml", "conf/CLUSTER.YAML", "conf/cluster.yaml~", "conf/.cluster.yaml.swp",
             "conf/#cluster.yaml#", "conf/cluster.yaml.bak", "Conf/Cluster.yaml.orig", "keys/rented.BAK",
             "keys/Rented", "conf/pins.old", "conf/pins2", "keys/rented-notes.md", "conf/other.yaml", "train.py"]
    assert shippable(names, named) == ["conf/pins2", "keys/rented-notes.md", "conf/other.yaml", "train.py"]


def test_the_runs_folder_in_use_stays_home_whatever_its_case_and_with_its_backups() -> None:
    """Security review, item 6: `--runs-dir results` inside the project holds host A's fetched tree; no
    other host may get it, whether .gitignore names the folder or not."""
    names = ["results/20261130-000000-abcd/hosts/A/train.log", "results/x/launch.json", "Results/x/summary.json",
             "results.bak/x/launch.json", "results2/a.py", "src/results/a.py", "train.py"]
    assert shippable(names, frozenset(), frozenset({"results"})) == ["results2/a.py", "src/results/a.py", "train.py"]
    assert shippable(["exp/runs/a/launch.json", "exp/a.py"], frozenset(), frozenset({"exp/runs"})) == ["exp/a.py"]
    assert shippable(["a.py"], frozenset(), frozenset({""})) == ["a.py"]  # "": the folder lies outside the project


def test_a_runs_dir_inside_the_project_is_not_synced_by_any_command(tmp_path) -> None:
    """From `Project.runs` to the file list rsync gets, in a real git project (no .gitignore):
    `code_files` is what `fab sync`, `train`, `setup` and `join` all ship (through `sync_code`)."""
    for name in ("train.py", "results/20261130-000000-abcd/launch.json",
                 "results/20261130-000000-abcd/hosts/A/train.log", "fetched/x/hosts/A/metrics.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/cluster.yaml").write_text("hosts:\n  gpu1: {address: 10.0.0.1}\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    inventory = load_inventory(tmp_path / "conf" / "cluster.yaml")
    assert code_files(inventory, Project(tmp_path, tmp_path / "results")).split(b"\0") == [
        b"fetched/x/hosts/A/metrics.jsonl", b"train.py", b""]
    assert code_files(inventory, Project(tmp_path, tmp_path / "fetched")).split(b"\0") == [
        b"results/20261130-000000-abcd/hosts/A/train.log", b"results/20261130-000000-abcd/launch.json",
        b"train.py", b""]
    with pytest.raises(InputError, match=r"^--runs-dir .*: is the project itself"):
        code_files(inventory, Project(tmp_path, tmp_path))


def test_a_local_hosts_workdir_in_the_project_is_not_synced_into_itself(tmp_path) -> None:
    """`workdir: wd` on a local host is a folder of the project that holds the last copy: shipped,
    each sync nested one more copy (`wd/wd/wd`, 341, 682, then 1023 files in the review)."""
    for name in ("train.py", "wd/train.py", "wd/wd/train.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/local.yaml").write_text("hosts:\n  l: {address: local, nproc: 1, workdir: wd}\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    inventory = load_inventory(tmp_path / "conf" / "local.yaml", tmp_path)
    assert code_files(inventory, Project(tmp_path, tmp_path / "runs")).split(b"\0") == [b"train.py", b""]
