"""`fab fetch-checkpoints` against a hostile host (issue 12, holes 1 and 2) on the simulated
cluster: real sshd, rsync and namespaces; the host's run directory is planted by
`tests/hostile.py`, no training runs. The host serves manifest lines aimed at controller files,
symlinks to controller files, a FIFO, a device, setuid and foreign-owned files, names the trainer
never writes and a huge manifest; the controller's canary files must stay exactly as they were.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.fabrun import ROOT, FabProcess, fab
from tests.hostile import Canary, HostileRun, listing, manifest, odd_entries, plant_run, remove_run, sha256, tree

pytestmark = [pytest.mark.cluster, pytest.mark.either_cluster]

GOOD = b"the good checkpoint at step 2\n"
GOOD_NAME = "ckpt-step000000002.pt"
SECRET = b"controller secret, never to leave this machine\n"
WRONG = b"f" * 64


def bad_lines(canaries: dict[str, Canary]) -> list[bytes]:
    """Manifest lines the controller must report and not act on; the first three aim at canaries
    with a hash that does not match (the old fetch deleted such files)."""
    absolute = str(canaries["abs"].path).encode()
    climbing = b"../" * 40 + str(canaries["rel"].path).lstrip("/").encode()
    return [
        WRONG + b"  " + absolute,
        WRONG + b"  " + climbing,
        WRONG + b"  " + GOOD_NAME.encode() + b"/../../" + climbing,
        sha256(b"xx").encode() + b"  ckpt-stepXX.pt",  # the old fetch crashed on it (int('XX'))
        WRONG + b"  ckpt-step00000001.pt",  # 8 digits
        WRONG + "  ckpt-step٠٠٠٠٠٠٠٠١.pt".encode(),  # Arabic-Indic digits
        WRONG + b"  best.pt\x00../../etc/passwd",
        sha256(GOOD).encode() + b"  " + GOOD_NAME.encode() + b"\r",  # CRLF
        WRONG + b"  " + b"A" * 5000,
        b"  best.pt",
        sha256(GOOD).encode() + b"  " + GOOD_NAME.encode(),  # listed twice
    ]


def hostile_run(canaries: dict[str, Canary]) -> HostileRun:
    lines = [sha256(GOOD).encode() + b"  " + GOOD_NAME.encode(),
             sha256(SECRET).encode() + b"  best.pt",  # true for the link's target: only a link can pass it
             *bad_lines(canaries)]
    return HostileRun(
        files={f"checkpoints/{GOOD_NAME}": GOOD, "checkpoints/MANIFEST.sha256": manifest(*lines),
               "checkpoints/ckpt-stepXX.pt": b"xx", "checkpoints/evil.pt": b"not in the manifest",
               "metrics.jsonl": b'{"kind": "epoch"}\n', "hosts/h2/train.log": b"log\n",
               "hosts/h2/tool": b"#!/bin/sh\n", "hosts/h2/owned": b"someone else's\n"},
        modes={"hosts/h2/tool": 0o6755},
        owners={"hosts/h2/owned": 4242},
        links={"checkpoints/best.pt": str(canaries["link"].path), "hosts/h2/hostname": "/etc/hostname",
               "hosts/h2/etc": "/etc", "logs": str(canaries["link"].path.parent)},
        fifos=["hosts/h2/pipe"],
        devices=["hosts/h2/null"],
    )


@pytest.fixture
def canaries(tmp_path: Path) -> dict[str, Canary]:
    folder = tmp_path / "controller"
    return {name: Canary.make(folder / f"canary-{name}", SECRET) for name in ("abs", "rel", "link")}


def test_hostile_host_spoils_only_its_own_share(testbed, inventory: Path, tmp_path: Path,
                                                canaries: dict[str, Canary]) -> None:
    run_id = plant_run(testbed, 2, inventory, hostile_run(canaries))
    home = ROOT / "runs" / run_id
    before = listing(ROOT, skip=home), listing(tmp_path, skip=home)
    try:
        done = fab("fetch-checkpoints", "--run", run_id, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr  # a manifest with refused lines
        assert all(c.untouched() for c in canaries.values())
        assert (listing(ROOT, skip=home), listing(tmp_path, skip=home)) == before
        assert odd_entries(home) == []
        # Only the verified checkpoint is assembled, with a manifest of exactly it.
        assert tree(home / "checkpoints") == {GOOD_NAME: GOOD,
                                              "MANIFEST.sha256": f"{sha256(GOOD)}  {GOOD_NAME}\n".encode()}
        landed = tree(home / "hosts/h2")
        assert sorted(landed) == ["checkpoints/MANIFEST.sha256", f"checkpoints/{GOOD_NAME}",
                                  "checkpoints/ckpt-stepXX.pt", "checkpoints/evil.pt", "hosts/h2/owned",
                                  "hosts/h2/tool", "hosts/h2/train.log", "metrics.jsonl"]
        hostname = Path("/etc/hostname").read_bytes()
        assert not [k for k, v in tree(home).items() if v in (SECRET, hostname)]
        for number in range(3, 3 + len(bad_lines(canaries))):
            assert done.stderr.count(f"host 'h2': checkpoints/MANIFEST.sha256 line {number} ignored") == 1, \
                done.stderr
        assert done.stderr.count("MANIFEST.sha256 line") == len(bad_lines(canaries))
        assert "hostname is not a regular file" in done.stderr and "best.pt is not a regular file" in done.stderr
        assert "Traceback" not in done.stdout + done.stderr

        # Fetching again changes nothing and finds no conflict.
        again = fab("fetch-checkpoints", "--run", run_id, timeout=120)
        assert again.returncode == 1 and "not overwritten: " not in again.stdout, again.stdout + again.stderr
        assert tree(home / "hosts/h2") == landed and odd_entries(home) == []
        assert all(c.untouched() for c in canaries.values())
    finally:
        remove_run(testbed, 2, run_id)


def test_huge_manifest_is_refused_whole(testbed, inventory: Path) -> None:
    """Over 1 MiB, no line of it is used: nothing is verified, so nothing is assembled."""
    huge = manifest(sha256(GOOD).encode() + b"  " + GOOD_NAME.encode(), *[b"#" * 1000] * 2000)
    run_id = plant_run(testbed, 2, inventory, HostileRun(
        files={f"checkpoints/{GOOD_NAME}": GOOD, "checkpoints/MANIFEST.sha256": huge}))
    home = ROOT / "runs" / run_id
    try:
        done = fab("fetch-checkpoints", "--run", run_id, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "host 'h2': checkpoints/MANIFEST.sha256 is larger than 1048576 bytes; ignored" in done.stderr
        assert done.stderr.count("ignored") == 1
        assert not (home / "checkpoints").exists()
        # No usable line: the host claims nothing, so its checkpoints stay there, unless asked for.
        assert sorted(tree(home / "hosts/h2/checkpoints")) == ["MANIFEST.sha256"]
        every = fab("fetch-checkpoints", "--run", run_id, "--every-copy", timeout=120)
        assert every.returncode == 1 and not (home / "checkpoints").exists()
        assert tree(home / "hosts/h2/checkpoints")[GOOD_NAME] == GOOD  # the host's files, as data
    finally:
        remove_run(testbed, 2, run_id)


def big_run(size_mib: int) -> tuple[HostileRun, str]:
    name = "ckpt-step000000003.pt"
    return HostileRun(big={f"checkpoints/{name}": size_mib << 20}, files={"metrics.jsonl": b"{}\n"}), name


def host_manifest(testbed, run_id: str, name: str) -> str:
    """Write the manifest of the big file on the host (its bytes are random, made there)."""
    folder = f"/root/meshrun/runs/{run_id}/checkpoints"
    digest = testbed.exec(2, ["sha256sum", f"{folder}/{name}"]).stdout.split()[0]
    testbed.exec(2, ["python3", "-c", f"open('{folder}/MANIFEST.sha256', 'w').write('{digest}  {name}\\n')"])
    return digest


def wait_for(check, timeout: float, proc: FabProcess) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.proc.poll() is None, f"fetch ended before the point to interrupt it:\n{proc.output}"
        assert time.monotonic() < deadline, proc.output
        time.sleep(0.005)


def refetch_is_clean(run_id: str, name: str, digest: str) -> None:
    home = ROOT / "runs" / run_id
    done = fab("fetch-checkpoints", "--run", run_id, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not overwritten: " not in done.stdout
    assert sorted(tree(home / "hosts/h2")) == ["checkpoints/MANIFEST.sha256", f"checkpoints/{name}", "metrics.jsonl"]
    assert sha256((home / "checkpoints" / name).read_bytes()) == digest
    assert not (home / ".incoming").exists(), sorted(str(p.relative_to(home)) for p in (home / ".incoming").rglob("*"))


def staged_over(staging: Path, size: int) -> bool:
    """A file over `size` bytes is in the staging folder: the checkpoint part is crossing. The
    folder goes and comes back between the fetch's two parts, so one missing mid-walk is "not yet"."""
    try:
        return any(f.stat().st_size > size for f in staging.rglob("*") if f.is_file() and not f.is_symlink())
    except FileNotFoundError:
        return False


def test_fetch_killed_mid_transfer_resumes_cleanly(testbed, inventory: Path) -> None:
    """SIGKILL to fab and its rsync while a 24 MiB checkpoint crosses a 20 Mbit/s link: no
    partial or temp file is ever placed, and the next fetch ends without a conflict."""
    run, name = big_run(24)
    run_id = plant_run(testbed, 2, inventory, run)
    digest = host_manifest(testbed, run_id, name)
    staging = ROOT / "runs" / run_id / ".incoming/h2"
    try:
        with testbed.shaped("20mbit"):
            proc = FabProcess("fetch-checkpoints", "--run", run_id)
            try:
                wait_for(lambda: staged_over(staging, 2 << 20), 60, proc)
                proc.signal_group(signal.SIGKILL)
                proc.finish(10)
            finally:
                proc.close()
        # Cut in the second part (the checkpoints): only the first part's small files are placed.
        assert sorted(tree(ROOT / "runs" / run_id / "hosts/h2")) == ["checkpoints/MANIFEST.sha256", "metrics.jsonl"]
        refetch_is_clean(run_id, name, digest)
    finally:
        remove_run(testbed, 2, run_id)


def test_fetch_killed_while_placing_leaves_no_truncated_file(testbed, inventory: Path) -> None:
    """SIGKILL the moment the checkpoint's final name appears: it is whole (renamed into place,
    never copied there), and the next fetch finds it unchanged, not a conflict."""
    run, name = big_run(256)
    run_id = plant_run(testbed, 2, inventory, run)
    digest = host_manifest(testbed, run_id, name)
    landed = ROOT / "runs" / run_id / "hosts/h2/checkpoints" / name
    try:
        proc = FabProcess("fetch-checkpoints", "--run", run_id)
        try:
            wait_for(lambda: os.path.lexists(landed), 120, proc)
            proc.signal_group(signal.SIGKILL)
            proc.finish(10)
        finally:
            proc.close()
        assert landed.stat().st_size == 256 << 20 and sha256(landed.read_bytes()) == digest
        refetch_is_clean(run_id, name, digest)
    finally:
        remove_run(testbed, 2, run_id)
