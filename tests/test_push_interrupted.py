"""`fab train --resume`'s checkpoint push, cut short (Ctrl-C, a closed terminal, a lost link).

The push used to send the controller's MANIFEST.sha256 with the checkpoints, first (rsync sends in
sorted order): a push cut while the last checkpoint crossed left the host listing a file it never
got, and the next resume said "the hosts already hold step N; nothing pushed". And the manifest it
wrote afterwards listed only what rsync sent: a checkpoint that arrived whole before a cut was
skipped by --ignore-existing on every later push and never listed, so the trainer ignored it for
good. Real files and processes: real rsync to a local host, cut by a real SIGINT to its process
group (as a terminal's Ctrl-C) while the newest checkpoint is crossing, then the push again."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from meshrun.deploy.edges import checkpointpush
from meshrun.deploy.edges.checkpointpush import HASH_FILES, push_checkpoints
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.edges.sync import push_dir_argv
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.manifest import Manifest, ManifestEntry, manifest_text, parse_manifest
from meshrun.deploy.run.resume import pushed_manifest, same_as_ours, to_hash

RUN = "20260101-000000-abcd"
A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64
BIG = 8 << 20  # the newest checkpoint: at BWLIMIT it takes 32 s to cross, and is cut long before


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(**digests: str) -> Manifest:
    return Manifest(tuple(ManifestEntry(name, digest) for name, digest in digests.items()), ())


# --- the decision, pure ---------------------------------------------------------------------------

def test_the_host_is_asked_for_what_its_manifest_does_not_list_as_ours() -> None:
    ours = manifest(**{"best.pt": A, "ckpt-step000000100.pt": B, "ckpt-step000000200.pt": C})
    theirs = manifest(**{"best.pt": D, "ckpt-step000000100.pt": B})
    assert to_hash(ours, theirs) == ("best.pt", "ckpt-step000000200.pt")
    assert to_hash(ours, manifest()) == ("best.pt", "ckpt-step000000100.pt", "ckpt-step000000200.pt")
    assert to_hash(ours, ours) == ()


def test_a_held_unlisted_file_is_listed_only_when_its_hash_is_ours() -> None:
    """Held and unlisted: step 200 with our bytes (a push cut before its manifest) gets our line;
    step 300 with other bytes (the host's own save cut short) gets none; the host's best.pt, which
    the push never replaces, keeps the host's line; a line for a name not asked, or in another form,
    is no answer."""
    ours = manifest(**{"best.pt": A, "ckpt-step000000100.pt": B, "ckpt-step000000200.pt": C,
                       "ckpt-step000000300.pt": A})
    theirs = manifest(**{"best.pt": D, "ckpt-step000000100.pt": B})
    asked = to_hash(ours, theirs)
    answer = parse_manifest(f"{D}  best.pt\n{C}  ckpt-step000000200.pt\n{B}  ckpt-step000000300.pt\n"
                            f"{B}  ckpt-step000000100.pt\n{C}  ../ckpt-step000000200.pt\n{A}\n".encode())
    same = same_as_ours(ours, answer, asked)
    assert same == frozenset({"ckpt-step000000200.pt"})
    assert pushed_manifest(ours, theirs, same) == (
        f"{D}  best.pt\n{B}  ckpt-step000000100.pt\n{C}  ckpt-step000000200.pt\n")


def test_the_push_leaves_the_manifest_home(tmp_path: Path) -> None:
    host = Host(name="h1", address="local", ssh_address=None, user=None, port=None, identity=None, python=None,
                workdir=str(tmp_path / "w1"), network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())
    argv = push_dir_argv(host, tmp_path / "ck", f"runs/{RUN}/checkpoints", tmp_path, None,
                         leave_out=("MANIFEST.sha256",))
    assert argv == ["rsync", "--protect-args", "--timeout=60", "--archive", "--no-links", "--no-devices",
                    "--no-specials", "--mkpath", "--ignore-existing", "--exclude=/MANIFEST.sha256",
                    f"{tmp_path / 'ck'}/", f"{tmp_path / 'w1' / 'runs' / RUN / 'checkpoints'}/"]
    assert not any(a.startswith(("--inplace", "--partial", "--append")) for a in argv)  # a cut file: a temp name


def test_the_hash_query_prints_the_manifest_form_for_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "best.pt").write_bytes(b"best")
    (tmp_path / "ckpt-step000000100.pt").symlink_to(tmp_path / "best.pt")
    # A FIFO under a checkpoint's name (a review): a blocking open of it waited for ever.
    os.mkfifo(tmp_path / "ckpt-step000000300.pt")
    done = subprocess.run(["python3", "-c", HASH_FILES, str(tmp_path), "best.pt", "ckpt-step000000100.pt",
                           "ckpt-step000000200.pt", "ckpt-step000000300.pt"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, f"{sha(b'best')}  best.pt\n")


# --- a real push, cut by a real SIGINT ------------------------------------------------------------

def _checkpoints(directory: Path, files: dict[str, bytes], listed: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "MANIFEST.sha256").write_text(manifest_text({n: sha(files[n]) for n in listed}))


def _cut_while_crossing(name: str) -> Callable[..., None]:
    """In place of run_rsync: the push's own argv, slowed, and its process group sent SIGINT (what
    Ctrl-C in the terminal does) once `name` is crossing; then the controller's own interrupt."""
    def cut(argv: list[str], **_: object) -> None:
        dest = Path(argv[-1])
        proc = subprocess.Popen([argv[0], "--bwlimit=256", *argv[1:]], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not any(p.name.startswith(f".{name}.") and p.stat().st_size > 0
                      for p in (dest.iterdir() if dest.is_dir() else ())):
            assert proc.poll() is None and time.monotonic() < deadline, "rsync ended before the cut"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
        # The client rsync exits without waiting for its receiver, which removes its temp file in its
        # own clean-up: the cut is over when the whole group is.
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline + 30, "rsync's receiver outlived the cut"
            time.sleep(0.01)
        raise KeyboardInterrupt
    return cut


def _group_alive(group: int) -> bool:
    """Whether a live (not zombie) process of process group `group` is left on this machine."""
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(group).encode() and fields[0] != b"Z":
            return True
    return False


def _setup(tmp_path: Path, ours: dict[str, bytes], held: dict[str, bytes], listed: tuple[str, ...]):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: local, workdir: w1, nproc: 1}\n")
    project = Project(tmp_path, tmp_path / "runs")
    _checkpoints(project.run_home(RUN) / "checkpoints", ours, tuple(ours))
    host_dir = tmp_path / "w1" / "runs" / RUN / "checkpoints"
    if held:
        _checkpoints(host_dir, held, listed)
    return project, host_dir, load_inventory(tmp_path / "hosts.yaml", tmp_path)


def _push(project: Project, inventory, tmp_path: Path) -> None:
    with sessions_to(inventory.hosts, inventory, tmp_path) as sessions:
        push_checkpoints(select_hosts(inventory, "h1"), sessions, RUN, inventory, project, Renderer())


def _listed_and_intact(host_dir: Path) -> dict[str, str]:
    listed = parse_manifest((host_dir / "MANIFEST.sha256").read_bytes()).digests()
    assert {name: sha((host_dir / name).read_bytes()) for name in listed} == listed
    return listed


def test_a_push_cut_on_a_host_without_a_manifest_is_pushed_again(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario A: the host has nothing of the run. Cut while step 200 (the newest) crosses, the
    host holds best.pt, no manifest (it used to hold the controller's, listing step 200), and no
    step 200 under its name; the next resume pushes step 200 and lists it and best.pt. Step 100
    stays home: a resume pushes the newest step only (tests/test_push_newest.py)."""
    ours = {"best.pt": b"best at 200", "ckpt-step000000100.pt": b"step 100", "ckpt-step000000200.pt": os.urandom(BIG)}
    project, host_dir, inventory = _setup(tmp_path, ours, {}, ())
    with monkeypatch.context() as patched:
        patched.setattr(checkpointpush, "run_rsync", _cut_while_crossing("ckpt-step000000200.pt"))
        with pytest.raises(KeyboardInterrupt):
            _push(project, inventory, tmp_path)
    assert sorted(p.name for p in host_dir.iterdir()) == ["best.pt"]
    _push(project, inventory, tmp_path)
    assert _listed_and_intact(host_dir) == {name: sha(ours[name]) for name in ("best.pt", "ckpt-step000000200.pt")}


def test_a_checkpoint_that_arrived_before_the_cut_is_listed_by_the_next_push(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario B: the host lists step 100 and holds no best.pt. best.pt arrives whole (rsync sends
    it first, sorted), the push is cut while step 300 crosses; the next push sends only step 300
    (--ignore-existing skips best.pt), yet best.pt is listed, by the hash the host gave. Step 200
    stays home (a resume pushes the newest step only); the host keeps its own line for step 100.
    A held file with other bytes gets no line: the pure tests above."""
    ours = {"best.pt": b"best at 300", "ckpt-step000000100.pt": b"step 100", "ckpt-step000000200.pt": b"step 200",
            "ckpt-step000000300.pt": os.urandom(BIG)}
    held = {"ckpt-step000000100.pt": b"step 100"}
    project, host_dir, inventory = _setup(tmp_path, ours, held, ("ckpt-step000000100.pt",))
    with monkeypatch.context() as patched:
        patched.setattr(checkpointpush, "run_rsync", _cut_while_crossing("ckpt-step000000300.pt"))
        with pytest.raises(KeyboardInterrupt):
            _push(project, inventory, tmp_path)
    assert (host_dir / "best.pt").read_bytes() == b"best at 300"
    assert not (host_dir / "ckpt-step000000300.pt").exists()
    assert (host_dir / "MANIFEST.sha256").read_text() == f"{sha(b'step 100')}  ckpt-step000000100.pt\n"
    _push(project, inventory, tmp_path)
    assert _listed_and_intact(host_dir) == {name: sha(ours[name]) for name in
                                            ("best.pt", "ckpt-step000000100.pt", "ckpt-step000000300.pt")}
    assert not (host_dir / "ckpt-step000000200.pt").exists()
