"""`fab sync --data`: a link in SRC that leads outside it (a shard on a second disk, a split on the
NAS) reaches the hosts as what it leads to, listed in the manifest and verified; a link inside SRC
stays a link and is verified through. Before, a file link dangled on the host and failed forever as
"corrupt", and a folder link dangled while the sync said it succeeded. Real rsync, a local host's
workdir (the same argv as a remote one, minus `-e ssh`), no cluster."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from meshrun.deploy.edges.datasync import DATA_MANIFEST, build_manifest
from meshrun.deploy.edges.datawalk import secret_name
from meshrun.deploy.errors import InputError
from meshrun.deploy.run.dataplan import unsafe_link
from tests.datalocal import homes, sync  # noqa: F401 (homes: the autouse fixture)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_links_leaving_src_arrive_as_their_content_and_are_verified(tmp_path: Path) -> None:
    src, nas = tmp_path / "src", tmp_path / "nas" / "train"
    (src / "sub").mkdir(parents=True)
    (nas / "cls").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (tmp_path / "outside.bin").write_bytes(b"shared shard")
    (nas / "img1.bin").write_bytes(b"img1")
    (nas / "cls" / "img2.bin").write_bytes(b"img2")
    (src / "x").symlink_to("../outside.bin")  # relative, leaving SRC
    (src / "d").symlink_to(nas)  # absolute: resolves on a local host only, dangles on a remote one
    (src / "w").symlink_to("a.bin")  # inside SRC: stays a link
    (src / "sub" / "y").symlink_to("../a.bin")
    (src / "alias").symlink_to("sub")
    dest = tmp_path / "wd" / "data" / "ds"
    dest.mkdir(parents=True)
    (dest / "x").symlink_to("../outside.bin")  # what an older meshrun left there: dangling links
    (dest / "d").symlink_to("/nonexistent/train")

    result = sync(src, tmp_path)
    assert result.repaired == () and result.files == 6
    # A corrupt copy of a linked folder's file (size and mtime kept) is found and sent again from the NAS.
    st = os.stat(dest / "d" / "img1.bin")
    (dest / "d" / "img1.bin").write_bytes(b"IMG1")
    os.utime(dest / "d" / "img1.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sync(src, tmp_path).repaired == ("d/img1.bin",)
    shutil.rmtree(tmp_path / "nas")  # as on a remote host: the targets are not there
    (tmp_path / "outside.bin").unlink()
    assert not (dest / "x").is_symlink() and (dest / "x").read_bytes() == b"shared shard"
    assert not (dest / "d").is_symlink() and (dest / "d" / "img1.bin").read_bytes() == b"img1"
    assert (dest / "d" / "cls" / "img2.bin").read_bytes() == b"img2"
    assert [os.readlink(dest / n) for n in ("w", "sub/y", "alias")] == ["a.bin", "../a.bin", "sub"]
    assert (dest / DATA_MANIFEST).read_text() == "".join(f"{sha(b)}  {n}\n" for n, b in (
        ("a.bin", b"a"), ("d/cls/img2.bin", b"img2"), ("d/img1.bin", b"img1"), ("sub/y", b"a"), ("w", b"a"),
        ("x", b"shared shard")))
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--quiet", DATA_MANIFEST], cwd=dest, check=True)


def test_a_link_loop_leaving_src_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a short SRC: the messages below are whole, not shortened
    src = Path("src")
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.bin").write_bytes(b"f")
    (src / "sub" / "again").symlink_to(tmp_path / "src")  # absolute: rsync would copy SRC into itself without end
    (src / "here").symlink_to(".")  # inside SRC: rsync keeps it a link, no loop
    with pytest.raises(InputError) as err:
        build_manifest(src)
    assert str(err.value) == f"--data: src/sub/again -> {tmp_path}/src: the link leads back into a folder above it " \
                             "(a loop); remove it or point it elsewhere"


def test_a_link_leaving_src_to_nothing_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    src = Path("src")
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (src / "model.pt").symlink_to("/scratch/only-on-the-hosts/model.pt")
    with pytest.raises(InputError) as err:
        build_manifest(src)
    assert str(err.value) == "--data: src/model.pt -> /scratch/only-on-the-hosts/model.pt: the link leaves SRC, so " \
                             "what it leads to is sent, but here it leads to nothing (no such file or directory); " \
                             "fix the link or move it out of SRC"


def test_a_relative_link_climbing_out_of_a_sent_folder_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """rsync judges a link inside a linked folder against SRC: `../../shared.bin` there stays a link,
    which on the hosts leads into DEST, not to the NAS file the controller hashed."""
    monkeypatch.chdir(tmp_path)
    src, nas = Path("src"), Path("nas")
    src.mkdir()
    (nas / "train" / "cls").mkdir(parents=True)
    (nas / "shared.bin").write_bytes(b"s")
    (nas / "train" / "cls" / "img.bin").symlink_to("../../shared.bin")
    (src / "train").symlink_to(tmp_path / "nas" / "train")
    with pytest.raises(InputError) as err:
        build_manifest(src)
    assert str(err.value) == "--data: src/train/cls/img.bin -> ../../shared.bin: the link climbs out of src/train, " \
                             "whose content is sent, so on the hosts it would lead elsewhere; make it absolute or " \
                             "keep it inside that folder"


CASES = [("top-up", "../x"), ("top-abs", "{tmp}/x"), ("top-in", "x"), ("top-dot", "./x"), ("top-in-up", "a/../x"),
         ("top-up-in", "../s/x"), ("a/one-up", "../x"), ("a/two-up", "../../x"), ("a/b/two-up", "../../x"),
         ("a/b/three-up", "../../../x"), ("a/deep", "c/../../x"), ("a/trail", "..")]


def test_unsafe_link_is_rsyncs_own_judgement(tmp_path: Path) -> None:
    """The manifest lists what rsync sends: a link it keeps, or the content of one it copies. So
    `unsafe_link` must say what real rsync's --copy-unsafe-links does, case by case."""
    src, dest = tmp_path / "s", tmp_path / "d"
    (tmp_path / "x").write_bytes(b"outside")
    cases = [(rel, target.format(tmp=tmp_path)) for rel, target in CASES]
    for rel, target in cases:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).symlink_to(target)
    for folder in ("", "a", "a/b", "a/c"):
        (src / folder).mkdir(parents=True, exist_ok=True)
        (src / folder / "x").write_bytes(b"inside")
    subprocess.run(["rsync", "--archive", "--copy-unsafe-links", f"{src}/", f"{dest}/"], check=True,
                   capture_output=True)
    kept = {rel: (dest / rel).is_symlink() for rel, _ in cases}
    expected = {"top-up": False, "top-abs": False, "top-in": True, "top-dot": True, "top-in-up": False,
                "top-up-in": False, "a/one-up": True, "a/two-up": False, "a/b/two-up": True, "a/b/three-up": False,
                "a/deep": False, "a/trail": True}
    if rsync_version() < (3, 4):  # before 3.4 rsync kept a `..` after another component as a link
        for rel in ("top-in-up", "a/deep"):
            del kept[rel], expected[rel]
    assert kept == expected
    assert {rel: not unsafe_link(target, rel) for rel, target in cases if rel in kept} == kept


def rsync_version() -> tuple[int, ...]:
    out = subprocess.run(["rsync", "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(n) for n in re.search(r"version\s+v?(\d+)\.(\d+)", out).groups())


KEPT_HOME = "would be sent through this link, which leaves SRC, and is named like a file meshrun keeps home (an SSH " \
            "key, known_hosts, an inventory); move it out of what the link leads to, or drop the link"


def test_a_link_leaving_src_to_the_users_keys_is_refused_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset folder with a link to ~/.ssh (an unpacked archive, a link made long ago) would ship
    the user's SSH keys to every host, as data: the sync stops, naming the link and the file."""
    monkeypatch.chdir(tmp_path)  # short paths: the messages below are whole
    ssh, src = Path("home/.ssh"), Path("home/datasets/cifar")
    ssh.mkdir(parents=True)
    (src / "train").mkdir(parents=True)
    (ssh / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY----- secret\n")
    (ssh / "hosts.yaml").write_text("hosts: {}\n")
    (src / "train" / "0.png").write_bytes(b"png")
    (src / "extra").symlink_to("../../.ssh")
    with pytest.raises(InputError) as err:
        sync(src, tmp_path)
    assert str(err.value) == f"--data: home/datasets/cifar/extra -> ../../.ssh: extra/id_ed25519 {KEPT_HOME}"
    assert not (tmp_path / "wd" / "data").exists()  # refused while SRC is walked: no rsync ran


@pytest.mark.parametrize("made, link, target, file", [
    ("k/id_rsa", "model.bin", "../k/id_rsa", "model.bin"),  # a file link, judged by the file it leads to
    ("proj/inventory/lab.yaml", "proj", "../proj", "proj/inventory/lab.yaml"),  # a project's inventory
    ("ssh/KNOWN_HOSTS.bak", "extra", "../ssh", "extra/KNOWN_HOSTS.bak"),  # any case, an editor's copy
    ("certs/deep/server.pem", "certs", "../certs", "certs/deep/server.pem"),
])
def test_every_name_the_code_sync_keeps_home_is_refused_behind_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: str, link: str, target: str, file: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("src").mkdir()
    Path(made).parent.mkdir(parents=True)
    Path(made).write_bytes(b"secret")
    (Path("src") / link).symlink_to(target)
    with pytest.raises(InputError) as err:
        build_manifest(Path("src"))
    assert str(err.value) == f"--data: src/{link} -> {target}: {file} {KEPT_HOME}"


def test_a_link_leaving_src_to_plain_data_syncs_and_says_what_went_through_it(tmp_path: Path) -> None:
    """The user sees what left the dataset folder: each link leaving SRC and how many files went
    through it, in the result every host's line is printed from. A `runs` folder and a `hosts.yaml`
    of a dataset's own are data (only an inventory's are kept home)."""
    src, nas = tmp_path / "src", tmp_path / "nas"
    (src / "train").mkdir(parents=True)
    (nas / "runs" / "r1").mkdir(parents=True)
    (src / "train" / "0.png").write_bytes(b"png")
    (nas / "runs" / "r1" / "loss.csv").write_bytes(b"1,2")
    (nas / "runs" / "hosts.yaml").write_bytes(b"a: 1")
    (nas / "big.bin").write_bytes(b"big")
    (src / "runs").symlink_to("../nas/runs")
    (src / "big.bin").symlink_to(nas / "big.bin")
    (src / "same").symlink_to("train")  # inside SRC: a link, nothing leaves
    result = sync(src, tmp_path)
    assert result.links == ("big.bin -> " + str(nas / "big.bin") + ": sent as its content (1 file)",
                            "runs -> ../nas/runs: sent as its content (2 files)")
    dest = tmp_path / "wd" / "data" / "ds"
    assert (dest / "runs" / "r1" / "loss.csv").read_bytes() == b"1,2" and (dest / "big.bin").read_bytes() == b"big"
    assert result.files == 4 and build_manifest(src).links == result.links
    (src / "runs").unlink()
    (src / "big.bin").unlink()
    assert sync(src, tmp_path).links == ()


def test_secret_name_is_the_code_syncs_judgement_less_its_runs_rule() -> None:
    names = ["id_ed25519", "x/id_rsa_work", "x/id_ed25519.pub", "x/ID_RSA", "x/id_rsa.bak", "x/#id_rsa#",
             "x/.id_rsa.swp", "known_hosts", "x/known_hosts.old", "a/b/server.pem", "tls.key", "inventory/lab.yaml",
             "Inventory/LAB.YML~", "runs/id_rsa", "runs/x/known_hosts", "inventory/lab.example.yaml", "x/hosts.yaml",
             "runs/r1/launch.json", "runs", "id.png", "x/keys.txt", "monkey.png", "x/ida_1.png", "x/id_a.b.c"]
    assert {n: secret_name(n) for n in names} == {n: i < 15 for i, n in enumerate(names)}
