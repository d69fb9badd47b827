"""A detached run's provenance (issue 23, item 4): no summary.json will hold it, so `fab train
--detach` saves the launch's part in `runs/<id>/provenance.json` and `fab report` adds the end from
the files `fab fetch-checkpoints` brought home (deploy/edges/provenance.detached). Those files came
from the hosts: read as a host's answer is, never through a symlink. Then a real detached run on the
local inventory, reported."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from meshrun.deploy.edges.provenance import detached
from tests.fabrun import ROOT, fab, run_id_of, run_processes

ORIGIN = {"project": None, "meshrun": {"version": "0.1.0", "build": "abcdef012345"}, "hosts": {"h1": {"torch": "2.14.1"}}}
CONFIG = {"epochs": 3, "data": {"name": "digits"}}


def _manifest(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True)
    (folder / "MANIFEST.sha256").write_text("".join(f"{digest}  {name}\n" for name, digest in files.items()))


def test_the_end_is_read_from_the_fetched_files_newest_checkpoints_first(tmp_path: Path) -> None:
    home = tmp_path / "r1"
    home.mkdir()
    assert detached(tmp_path, "r1", None) is None  # no launch record: an attached or older run
    (home / "provenance.json").write_text(json.dumps(ORIGIN))
    h1, h2, h3 = (home / "hosts" / h for h in ("h1", "h2", "h3"))
    _manifest(h1 / "checkpoints", **{"ckpt-step000000010.pt": "a" * 64})
    _manifest(h2 / "checkpoints", **{"ckpt-step000000010.pt": "a" * 64, "ckpt-step000000020.pt": "b" * 64,
                                      "best.pt": "c" * 64, "../evil.pt": "d" * 64})
    (h1 / "metrics.jsonl").write_text(json.dumps({"kind": "step"}) + "\n" + json.dumps({"kind": "config", "config": CONFIG}) + "\n")
    h3.mkdir()  # a host whose files point elsewhere: not followed
    (tmp_path / "elsewhere.jsonl").write_text(json.dumps({"kind": "config", "config": {"stolen": True}}) + "\n")
    (h3 / "metrics.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    (h3 / "checkpoints").mkdir()
    (h3 / "checkpoints" / "MANIFEST.sha256").symlink_to(h2 / "checkpoints" / "MANIFEST.sha256")
    plan = {"links": [{"source": "h1", "target": "h2", "mbit_s": 100.0, "rtt_ms": 1.0}]}
    found = detached(tmp_path, "r1", plan)
    assert found == {**ORIGIN, "trainer_config": CONFIG, "links": found["links"],
                     "checkpoints": {"host": "h2", "files": {"ckpt-step000000010.pt": "a" * 64,
                                                            "ckpt-step000000020.pt": "b" * 64, "best.pt": "c" * 64}}}
    assert found["links"]["matrix"] == plan["links"]
    (home / "provenance.json").write_text("[1, 2]")
    assert detached(tmp_path, "r1", None) is None


@pytest.mark.slow
def test_a_detached_local_run_is_reported_with_its_provenance() -> None:
    started = fab("train", "--detach", "--", "epochs=1", "log.tensorboard=false", timeout=240)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    run_id = run_id_of(started.stdout)
    home = ROOT / "runs" / run_id
    deadline = time.monotonic() + 180
    while run_processes(run_id) or not (home / "hosts" / "local" / "exit.json").exists():
        assert time.monotonic() < deadline, "the detached run did not end"
        time.sleep(1)
    assert not (home / "summary.json").exists()  # what a detached run never has
    data = json.loads(fab("report", "--run", run_id, "--json").stdout)
    prov = data["provenance"]
    assert json.loads((home / "provenance.json").read_text()) == {k: prov[k] for k in ("project", "meshrun", "hosts")}
    assert prov["hosts"]["local"]["gpus"] == [] and prov["links"] is None
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (home / "checkpoints").glob("*.pt")}
    assert on_disk and prov["checkpoints"] == {"host": "fetched", "files": on_disk}
    config = next(json.loads(line) for line in (home / "metrics.jsonl").open() if '"kind": "config"' in line)
    assert prov["trainer_config"] == config["config"]
    shown = fab("report", "--run", run_id)
    assert shown.returncode == 0, shown.stderr
    assert all(f"checkpoint {name}: sha256 {digest}" in shown.stdout for name, digest in on_disk.items())
