"""`fab train --resume` pushes the newest fetched step and best.pt, not the whole home folder.

The home `runs/<id>/checkpoints/` keeps every step each fetch verified (a review: 168 steps after
weeks, 34 GB), and the resume's push used to rsync all of it to the rendezvous host, whose disk
it could fill, within one FETCH_TIMEOUT_S. The trainer loads the newest step (train/checkpoint.
restore_agreed). Pure decision by exact equality; then a real rsync to a local host."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from meshrun.deploy.edges.checkpointpush import push_checkpoints
from meshrun.deploy.edges.sessions import sessions_to
from meshrun.deploy.edges.sync import push_named_argv
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.inventory.selection import select_hosts
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.manifest import Manifest, ManifestEntry, manifest_text, parse_manifest
from meshrun.deploy.run.resume import pushed_manifest, to_hash, to_push

RUN = "20260101-000000-abcd"
A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(**digests: str) -> Manifest:
    return Manifest(tuple(ManifestEntry(name, digest) for name, digest in digests.items()), ())


def step(n: int) -> str:
    return f"ckpt-step{n:09d}.pt"


# --- what is pushed, pure -------------------------------------------------------------------------

def test_the_newest_step_and_best_are_pushed_in_the_manifests_order() -> None:
    ours = manifest(**{"best.pt": A, step(100): B, step(300): C, step(200): D})
    assert to_push(ours) == manifest(**{"best.pt": A, step(300): C})


def test_without_best_only_the_newest_step_and_without_steps_only_best() -> None:
    assert to_push(manifest(**{step(100): B, step(20): C})) == manifest(**{step(100): B})
    assert to_push(manifest(**{"best.pt": A})) == manifest(**{"best.pt": A})
    assert to_push(manifest()) == manifest()


def test_weeks_of_fetched_steps_push_one() -> None:
    ours = manifest(**{step(n * 1000): A for n in range(1, 169)}, **{"best.pt": B})
    assert to_push(ours) == manifest(**{step(168000): A, "best.pt": B})


def test_a_step_left_home_is_neither_hashed_nor_listed() -> None:
    """The host lists its own step 100; steps 200 and 300 were fetched from another host. Only step
    300 is asked for and, held with our bytes, listed; step 200 stays home and off the host's list."""
    ours = to_push(manifest(**{step(100): B, step(200): C, step(300): D}))
    theirs = manifest(**{step(100): B})
    assert to_hash(ours, theirs) == (step(300),)
    assert pushed_manifest(ours, theirs, {step(300)}) == f"{B}  {step(100)}\n{D}  {step(300)}\n"


def _host(tmp_path: Path, address: str = "local") -> Host:
    return Host(name="h1", address=address, ssh_address=None, user=None, port=None, identity=None, python=None,
                workdir=str(tmp_path / "w1"), network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())


def test_the_push_argv_names_each_file_and_excludes_the_rest(tmp_path: Path) -> None:
    argv = push_named_argv(_host(tmp_path), tmp_path / "ck", ("best.pt", step(300)), f"runs/{RUN}/checkpoints",
                           tmp_path, None)
    assert argv == ["rsync", "--protect-args", "--timeout=60", "--archive", "--no-links", "--no-devices",
                    "--no-specials", "--mkpath", "--ignore-existing", "--include=/best.pt",
                    f"--include=/{step(300)}", "--exclude=*",
                    f"{tmp_path / 'ck'}/", f"{tmp_path / 'w1' / 'runs' / RUN / 'checkpoints'}/"]


@pytest.mark.parametrize("name", ["*.pt", "ckpt-step?.pt", "[a].pt", "a\\b", "sub/best.pt", ""])
def test_a_name_that_would_match_more_than_itself_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not a plain file name"):
        push_named_argv(_host(tmp_path), tmp_path / "ck", ("best.pt", name), "x", tmp_path, None)


# --- a real push to a local host ------------------------------------------------------------------

def _checkpoints(directory: Path, files: dict[str, bytes], listed: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "MANIFEST.sha256").write_text(manifest_text({n: sha(files[n]) for n in listed}))


def _resume_push(tmp_path: Path, ours: dict[str, bytes], held: dict[str, bytes]) -> Path:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: local, workdir: w1, nproc: 1}\n")
    project = Project(tmp_path, tmp_path / "runs")
    _checkpoints(project.run_home(RUN) / "checkpoints", ours, tuple(ours))
    (project.run_home(RUN) / "checkpoints" / "notes").mkdir()  # a folder of yours at home: not pushed either
    host_dir = tmp_path / "w1" / "runs" / RUN / "checkpoints"
    if held:
        _checkpoints(host_dir, held, tuple(held))
    inventory = load_inventory(tmp_path / "hosts.yaml", tmp_path)
    with sessions_to(inventory.hosts, inventory, tmp_path) as sessions:
        push_checkpoints(select_hosts(inventory, "h1"), sessions, RUN, inventory, project, Renderer())
    return host_dir


def test_a_host_without_checkpoints_gets_the_newest_step_and_best_only(tmp_path: Path) -> None:
    ours = {step(n): f"step {n}".encode() for n in range(100, 1100, 100)} | {"best.pt": b"best at 700"}
    host_dir = _resume_push(tmp_path, ours, {})
    assert sorted(p.name for p in host_dir.iterdir()) == ["MANIFEST.sha256", "best.pt", step(1000)]
    assert parse_manifest((host_dir / "MANIFEST.sha256").read_bytes()).digests() == {
        "best.pt": sha(b"best at 700"), step(1000): sha(b"step 1000")}


def test_a_host_keeps_its_own_steps_and_gets_only_the_newest(tmp_path: Path) -> None:
    ours = {step(100): b"step 100", step(200): b"step 200", step(300): b"step 300"}
    host_dir = _resume_push(tmp_path, ours, {step(100): b"step 100"})
    assert sorted(p.name for p in host_dir.iterdir()) == ["MANIFEST.sha256", step(100), step(300)]
    assert (host_dir / "MANIFEST.sha256").read_text() == (
        f"{sha(b'step 100')}  {step(100)}\n{sha(b'step 300')}  {step(300)}\n")
