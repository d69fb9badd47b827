"""`fab sync --data`: a dataset reaches each simulated host, unchanged data is not sent again,
and a corrupt copy with the right size and mtime (which rsync's quick check would miss) is found
by the sha256 manifest and repaired (cluster tests). SRC is the user's and is only ever read: the
manifest, the hash cache and the staged copy sent to hosts never touch it, whether the sync works
or fails (single-machine tests on real files, a local host and real rsync)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from meshrun.deploy.edges import datasync
from meshrun.deploy.edges.datasync import (DATA_MANIFEST, DataSpec, build_manifest, hash_cache_file, manifest_bytes,
                                           staged_manifest, sync_data)
from meshrun.deploy.edges.transport import LocalSession
from meshrun.deploy.errors import InputError, MeshrunError
from meshrun.deploy.inventory.model import Host, Network
from tests.fabrun import fab

USERS_OWN = b"my own checksums - precious\n"


@pytest.mark.cluster
@pytest.mark.either_cluster
def test_data_sync_skips_unchanged_and_repairs_corruption(testbed, inventory: Path, tmp_path: Path) -> None:
    data = tmp_path / "digits-data"
    (data / "sub").mkdir(parents=True)
    for name, size in (("a.bin", 200_000), ("b.bin", 3), ("sub/c.bin", 70_000)):
        (data / name).write_bytes(os.urandom(size))
    flag = f"{data}:data/digits"
    first = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "h2: data data/digits: 3 files verified by sha256; 3 sent" in first.stdout
    remote = "/root/meshrun/data/digits/sub/c.bin"
    assert testbed.exec(1, ["sha256sum", remote]).stdout.split()[0] == \
        hashlib.sha256((data / "sub/c.bin").read_bytes()).hexdigest()

    again = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert "h1: data data/digits: 3 files verified by sha256; unchanged, nothing sent" in again.stdout

    # Flip bytes on h2 but keep size and mtime: only the manifest can tell.
    testbed.exec(2, ["python3", "-c", f"import os; s = os.stat('{remote}'); f = open('{remote}', 'r+b'); "
                     f"f.write(b'XXXX'); f.close(); os.utime('{remote}', ns=(s.st_atime_ns, s.st_mtime_ns))"])
    repaired = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "h2: corrupt copies found and sent again: sub/c.bin" in repaired.stderr
    assert testbed.exec(2, ["sha256sum", remote]).stdout.split()[0] == \
        hashlib.sha256((data / "sub/c.bin").read_bytes()).hexdigest()

    # A file deleted from SRC (a mislabeled image, say) is deleted on the hosts too, and said.
    (data / "a.bin").unlink()
    pruned = fab("sync", "--inventory", str(inventory), "--hosts", "h1,h2", "--data", flag)
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert "h1: data data/digits: 2 files verified by sha256; unchanged, nothing sent; 1 removed (gone from SRC)" \
        in pruned.stdout
    assert testbed.exec(1, ["test", "-e", "/root/meshrun/data/digits/a.bin"], check=False).returncode == 1
    assert testbed.exec(1, ["test", "-e", remote]).returncode == 0


@pytest.mark.cluster
@pytest.mark.either_cluster
def test_bad_data_flag_is_one_line(tmp_path: Path) -> None:
    done = fab("sync", "--data", f"{tmp_path}/missing:data")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --data: {tmp_path}/missing is not a directory; point SRC at the local dataset directory"


# Single-machine tests: no cluster, no fab subprocess.

def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, `root` itself included: kind, mode, size, mtime and content hash (a
    link's target). Any file created, removed, rewritten or touched changes it."""
    seen: dict[str, tuple] = {}
    for top, dirs, files in os.walk(root):
        for name in ["", *dirs, *files] if top == str(root) else [*dirs, *files]:
            path = os.path.join(top, name) if name else top
            st = os.lstat(path)
            body = os.readlink(path) if os.path.islink(path) else \
                sha(Path(path).read_bytes()) if os.path.isfile(path) else None
            seen[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, body)
    return seen


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache folder and the temporary folder, both fresh and outside every SRC."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A dataset that holds the user's own MANIFEST.sha256 beside its data."""
    data = tmp_path / "ds1"
    (data / "sub").mkdir(parents=True)
    (data / "MANIFEST.sha256").write_bytes(USERS_OWN)
    (data / "x.bin").write_bytes(os.urandom(70_000))
    (data / "sub" / "y.bin").write_bytes(b"y")
    (data / "sub" / DATA_MANIFEST).write_bytes(b"a subfolder's file of that name is data\n")
    return data


def local_host(workdir: Path) -> Host:
    workdir.mkdir(parents=True, exist_ok=True)
    return Host(name="local", address="local", ssh_address=None, user=None, port=None, identity=None, python=None,
                workdir=str(workdir), network=Network.LAN, gpus=None, nproc=1, batch_size=None, env=())


def test_manifest_reads_src_only_and_caches_outside_it(homes: Path, src: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(src)
    manifest = build_manifest(src)
    assert manifest == {name: sha((src / name).read_bytes())
                        for name in ("MANIFEST.sha256", "sub/.meshrun-manifest.sha256", "sub/y.bin", "x.bin")}
    assert snapshot(src) == before
    assert hash_cache_file(src).is_file() and hash_cache_file(src).is_relative_to(homes / "cache" / "meshrun")

    def no_reading(path: str) -> str:
        raise AssertionError(f"hashed again: {path}")

    monkeypatch.setattr(datasync, "_sha256", no_reading)  # the cache answers for unchanged files
    assert build_manifest(src / "sub" / "..") == manifest  # another spelling of the same folder
    assert snapshot(src) == before


def test_local_sync_lands_both_manifests_and_repairs(homes: Path, src: Path, tmp_path: Path) -> None:
    host, root = local_host(tmp_path / "wd"), tmp_path / "proj"
    before = snapshot(src)
    manifest = build_manifest(src)
    spec = DataSpec(src, "data/ds")
    first = sync_data(host, LocalSession(host, root), sys.executable, spec, manifest, root, None, 60)
    dest = tmp_path / "wd" / "data" / "ds"
    assert (dest / "MANIFEST.sha256").read_bytes() == USERS_OWN  # the user's file is data, sent as is
    assert (dest / DATA_MANIFEST).read_bytes() == manifest_bytes(manifest)
    assert sorted(first.transferred) == sorted(manifest) and first.files == 4 and first.repaired == ()
    if shutil.which("sha256sum"):  # meshrun's manifest is sha256sum's format
        subprocess.run(["sha256sum", "--check", "--quiet", DATA_MANIFEST], cwd=dest, check=True)

    # Flip bytes at DEST, size and mtime kept: rsync skips it, the manifest catches it.
    st = os.stat(dest / "x.bin")
    with open(dest / "x.bin", "r+b") as f:
        f.write(b"XXXX")
    os.utime(dest / "x.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    again = sync_data(host, LocalSession(host, root), sys.executable, spec, build_manifest(src), root, None, 60)
    assert again.transferred == () and again.repaired == ("x.bin",)
    assert (dest / "x.bin").read_bytes() == (src / "x.bin").read_bytes()
    assert snapshot(src) == before
    assert os.listdir(homes / "tmp") == []  # the staged manifest is gone


def test_failed_sync_leaves_src_unchanged(homes: Path, src: Path, tmp_path: Path) -> None:
    host, root = local_host(tmp_path / "wd"), tmp_path / "proj"
    (tmp_path / "wd" / "blocker").write_text("a file where DEST's parent folder should be\n")
    before = snapshot(src)
    with pytest.raises(MeshrunError, match="data sync failed"):
        sync_data(host, LocalSession(host, root), sys.executable, DataSpec(src, "blocker/ds"), build_manifest(src),
                  root, None, 60)
    assert snapshot(src) == before
    assert os.listdir(homes / "tmp") == []


def test_nothing_is_written_inside_src_even_when_tmp_and_cache_are(src: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(src / "cachehome"))  # as with `--data ~:data`
    monkeypatch.setattr(tempfile, "tempdir", str(src / "sub"))
    before = snapshot(src)
    manifest = build_manifest(src)
    assert snapshot(src) == before
    with pytest.raises(InputError, match="set TMPDIR to a folder outside it"):
        with staged_manifest(src, manifest):
            pass
    assert snapshot(src) == before


def test_staged_manifest_avoids_a_tmp_inside_src(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(src / "sub"))
    before = snapshot(src)
    with staged_manifest(src, {"x.bin": "0" * 64}) as listing:
        assert listing.name == DATA_MANIFEST and listing.is_relative_to(tmp_path / "cache" / "meshrun")
        assert listing.read_bytes() == f"{'0' * 64}  x.bin\n".encode()
    assert not listing.exists() and snapshot(src) == before


def test_folders_named_like_meshrun_files_are_data_or_skipped(homes: Path, tmp_path: Path) -> None:
    data = tmp_path / "ds2"
    (data / "MANIFEST.sha256").mkdir(parents=True)
    (data / "MANIFEST.sha256" / "inner.bin").write_bytes(b"i")
    (data / ".meshrun-hash-cache.json").mkdir()  # an older meshrun's name: never data, as rsync --exclude says
    (data / ".meshrun-hash-cache.json" / "old").write_bytes(b"o")
    (data / "sub").mkdir()
    (data / "sub" / ".meshrun-hash-cache.json").write_text("{}")
    before = snapshot(data)
    assert build_manifest(data) == {"MANIFEST.sha256/inner.bin": sha(b"i")}
    assert snapshot(data) == before


def test_meshruns_manifest_name_at_src_top_is_one_line_input_error(homes: Path, src: Path) -> None:
    for make in (lambda p: p.write_text("mine\n"), lambda p: p.mkdir()):
        make(src / DATA_MANIFEST)
        before = snapshot(src)
        with pytest.raises(InputError) as err:
            build_manifest(src)
        assert str(err.value) == f"--data: {src / DATA_MANIFEST}: meshrun writes its own manifest under that " \
                                 "name at DEST; rename or move yours"
        assert snapshot(src) == before
        shutil.rmtree(src / DATA_MANIFEST) if (src / DATA_MANIFEST).is_dir() else (src / DATA_MANIFEST).unlink()


def test_unreadable_file_is_one_line_input_error(homes: Path, src: Path) -> None:
    (src / "sub" / "bad.bin").symlink_to("/proc/self/mem")  # a regular file whose first read fails, even for root
    before = snapshot(src)
    with pytest.raises(InputError) as err:
        build_manifest(src)
    assert str(err.value) == f"--data: cannot read {src / 'sub' / 'bad.bin'}: input/output error; make it readable " \
                             "or move it out of SRC"
    assert err.value.exit_code == 2 and snapshot(src) == before


def test_names_no_manifest_line_can_hold_are_input_errors(homes: Path, src: Path) -> None:
    for name in (b"two\nlines.bin", b"carriage\rreturn.bin", b"latin1-\xe9.bin"):
        path = Path(os.fsdecode(os.path.join(os.fsencode(src), name)))
        path.write_bytes(b"z")
        with pytest.raises(InputError, match="cannot be listed in the sha256 manifest; rename it") as err:
            build_manifest(src)
        assert "\n" not in str(err.value) and "\r" not in str(err.value)
        path.unlink()


def test_a_src_no_one_can_write_is_only_read(homes: Path) -> None:
    source = Path("/proc/sys/kernel/random")
    if not (source / "boot_id").is_file():
        pytest.skip("no /proc/sys/kernel/random/boot_id here")
    manifest = build_manifest(source)
    assert "boot_id" in manifest and hash_cache_file(source).is_file()


def test_a_folder_that_cannot_be_listed_is_one_line_input_error(homes: Path, src: Path) -> None:
    """A folder os.walk cannot open is named, not skipped (its files would go unverified). Made
    deep past PATH_MAX, through directory fds: no one can list it by its path, root included."""
    fd = os.open(src / "sub", os.O_RDONLY)
    try:
        for _ in range(20):  # 20 × 251 characters > 4096
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    with pytest.raises(InputError) as err:
        build_manifest(src)
    message = str(err.value)
    assert message.startswith("--data: cannot read ") and "file name too long" in message
    assert message.endswith("ddd: file name too long; make it readable or move it out of SRC") and len(message) < 300


def test_a_bad_src_is_said_even_when_a_host_cannot_be_reached(tmp_path: Path) -> None:
    """The real `meshrun sync --data`: the code sync runs beside the data's hashing, and its error (a
    host refusing the connection) used to be the one shown. A bad name in SRC is the user's to fix
    whatever the hosts do, so its line wins."""
    import socket

    project = tmp_path / "proj"
    (project / "inventory").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    with socket.socket() as probe:  # a port nothing listens on: the host refuses at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (project / "inventory" / "hosts.yaml").write_text(f"hosts:\n  gpu1: {{address: 127.0.0.1, port: {port}}}\n")
    data = tmp_path / "ds"
    data.mkdir()
    (data / "a.bin").write_bytes(b"a")
    (data / "two\nlines").write_bytes(b"b")
    env = {k: v for k, v in os.environ.items() if k != "MESHRUN_INVENTORY"} | {
        "MESHRUN_SSH_CONFIG": os.devnull, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([str(Path(sys.executable).parent / "meshrun"), "sync", "--data", f"{data}:data"],
                          cwd=project, capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        2, f"error: --data: {data}/two\\nlines: a name with a line break or bytes that are not UTF-8 cannot be "
           "listed in the sha256 manifest; rename it"), done.stderr
