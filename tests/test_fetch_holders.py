"""Which hosts' checkpoints `fab fetch-checkpoints` brings, on the simulated cluster (real sshd,
rsync and namespaces; the hosts' run directories are planted by `tests/hostile.py`, no training
runs): one copy when the hosts' copies are the same, and every file some host alone holds when they
differ, as after an elastic run where one host left early and another joined late."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fabrun import ROOT, fab
from tests.hostile import HostileRun, manifest, plant_runs, remove_run, sha256, tree

pytestmark = [pytest.mark.cluster]


def saves(steps: dict[int, bytes], best: bytes | None = None) -> HostileRun:
    """A trainer's checkpoints folder: the steps it keeps, best.pt if it wrote one, the manifest."""
    files = {f"checkpoints/ckpt-step{s:09d}.pt": data for s, data in steps.items()}
    if best is not None:
        files["checkpoints/best.pt"] = best
    lines = [f"{sha256(data)}  {name.removeprefix('checkpoints/')}".encode() for name, data in files.items()]
    return HostileRun(files={**files, "checkpoints/MANIFEST.sha256": manifest(*lines), "metrics.jsonl": b"{}\n"})


def test_the_hosts_copies_differ_after_an_elastic_run_and_each_file_comes_home(testbed, inventory: Path) -> None:
    """h1 ran from the start and left at step 800 (best.pt from step 700); h2 joined at 750 and
    trained to 1000 (restore loads best.pt's bytes, it never writes them). The fetch takes h2's
    copy (the newest) and then h1's, for the files only h1 holds; then, nothing new, none again.
    Before, only the newest holder's were fetched: best.pt and steps 600-700 stayed on h1."""
    step = {s: f"weights at {s}".encode() for s in (600, 700, 800, 900, 1000)}
    run_id = plant_runs(testbed, {1: saves({s: step[s] for s in (600, 700, 800)}, best=b"best at 700"),
                                  2: saves({s: step[s] for s in (800, 900, 1000)})}, inventory)
    home = ROOT / "runs" / run_id
    try:
        done = fab("fetch-checkpoints", "--run", run_id, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "checkpoints: taken from h2, h1 (" in done.stdout
        assert tree(home / "hosts/h1/checkpoints")["best.pt"] == b"best at 700"
        assert sorted(tree(home / "hosts/h1/checkpoints")) == ["MANIFEST.sha256", "best.pt", "ckpt-step000000600.pt",
                                                               "ckpt-step000000700.pt", "ckpt-step000000800.pt"]
        assert {k: v for k, v in tree(home / "checkpoints").items() if k != "MANIFEST.sha256"} == {
            f"ckpt-step{s:09d}.pt": step[s] for s in (800, 900, 1000)}  # assembled from the newest holder
        again = fab("fetch-checkpoints", "--run", run_id, timeout=120)
        assert again.returncode == 0 and "taken from" not in again.stdout, again.stdout + again.stderr
    finally:
        for host in (1, 2):
            remove_run(testbed, host, run_id)
