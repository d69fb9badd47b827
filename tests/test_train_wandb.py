"""``log.wandb``: Weights & Biases beside TensorBoard, in wandb's offline mode (no network).

The tests that run wandb need the package (``tests/run`` installs it, the ``wandb`` extra) and
skip, saying so, only where it cannot be imported. The offline run is read back from its own
``.wandb`` file (wandb's public API needs a server): a LevelDB-style log of wandb's protobuf
``Record`` messages, decoded with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from meshrun.train.__main__ import main
from tests.trainer.harness import records, train_hosts

NO_WANDB = "wandb is not installed here (tests/run installs it: pip install -e '.[test,wandb]')"
MISSING = ("train: error: log.wandb=true needs the wandb package, which this python cannot import: "
           "pip install wandb (on every host: add it to the project's requirements for fab setup), "
           "or set log.wandb=false")


@pytest.mark.parametrize("check", [True, False], ids=["check", "start"])
def test_missing_package_is_one_line_before_anything_runs(tmp_path: Path, check: bool,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # Python's own "not importable" marker
    run = tmp_path / "run"
    argv = ["--check"] if check else ["--run-dir", str(run)]
    assert main([*argv, "log.wandb=true"]) == 2
    assert capsys.readouterr().err.splitlines() == [MISSING]
    assert not run.exists()  # nothing half-written: the trainer stopped before its run dir


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No WANDB_* of whoever runs the tests; wandb's own files (settings, logs) under tmp."""
    pytest.importorskip("wandb", reason=NO_WANDB)
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name))


def test_rank0_logs_the_epoch_scalars_offline_with_the_hosts(tmp_path: Path, wandb_env: None) -> None:
    """Two simulated hosts (one torchrun each, as the controller starts them), no WANDB_MODE."""
    run_id = f"wandb-test-{os.getpid()}"  # tags every process of the run, wandb-core included
    key = "k3y" * 29  # a key in the environment, as the inventory's env puts it: offline, unused
    hosts = (("alpha", 1), ("beta", 1))
    done = train_hosts(tmp_path, hosts, "epochs=2", "log.wandb=true", torchrun=True,
                       envs={h: {"MESHRUN_RUN_ID": run_id, "WANDB_API_KEY": key} for h, _ in hosts})
    assert {h: p.returncode for h, p in done.items()} == {"alpha": 0, "beta": 0}, done["alpha"].stderr
    assert _tagged(run_id) == []  # nothing of wandb outlives the trainer
    run = tmp_path / "alpha" / "run"
    assert not (tmp_path / "beta" / "run" / "wandb").exists()  # rank 0 only
    [offline] = (run / "wandb").glob("offline-run-*")
    assert f"wandb: offline run in {offline}; upload it with: wandb sync {offline}" in done["alpha"].stdout
    assert [p for p in (run / "wandb").rglob("*") if p.is_symlink()] == []  # fetch brings it all
    recs = _wandb_records(offline)
    [started] = [r.run for r in recs if r.HasField("run")]
    assert (list(started.tags), started.display_name, started.run_group) == (["alpha", "beta"], run_id, run_id)
    config = {u.key: json.loads(u.value_json) for u in started.config.update if not u.key.startswith("_")}
    [resolved] = records(run, kind="config")
    assert config == {**resolved["config"],
                      "meshrun": {"run_id": run_id, "rank_hosts": ["alpha", "beta"]}}
    logged = [{i.nested_key[0]: json.loads(i.value_json) for i in r.history.item
               if not i.nested_key[0].startswith("_") or i.nested_key[0] == "_step"}
              for r in recs if r.HasField("history")]
    assert logged == [{"_step": e["global_step"], "train/loss": e["train_loss"], "train/acc1": e["train_acc"],
                       "test/loss": e["test_loss"], "test/acc1": e["test_acc"], "test/acc5": e["test_acc5"],
                       "lr": e["lr"]} for e in records(run, kind="epoch")]
    assert [r.exit.exit_code for r in recs if r.HasField("exit")] == [0]
    assert [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()] == []


def test_a_wandb_that_will_not_start_is_one_line_and_no_process(tmp_path: Path, wandb_env: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Online mode against a server that refuses (a closed local port): the trainer is told in
    one line and goes on without it, and the service wandb started is gone."""
    from meshrun.train import wandblog
    from meshrun.train.config import load_config
    from meshrun.train.dist import read_env

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 86)
    cfg = load_config(None, ("log.wandb=true", "dist.timeout=8"))  # init may take 4 s at most
    said: list[str] = []
    before = _children()
    assert wandblog.start(cfg, read_env({"WANDB_MODE": "online"}), tmp_path, ("alpha",), said.append) is None
    assert len(said) == 1 and said[0].startswith("wandb: not logging this run: "), said
    assert said[0].endswith("; metrics.jsonl and tensorboard/ still have every epoch")
    assert _children() - before == set()


def _wandb_records(offline: Path) -> list[Any]:
    """The records of the run's ``run-<id>.wandb``: a 7-byte header (``:W&B``, magic, version),
    then 32 KiB blocks of chunks, each ``crc32 | length (2) | type (1) | data``; type 1 is a whole
    record, 2/3/4 its first/middle/last part; a block's tail under 7 bytes is padding."""
    from wandb.proto import wandb_internal_pb2

    [path] = offline.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, part, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero-filled rest of a block
            pos += block - pos % block
            continue
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def _tagged(run_id: str) -> list[str]:
    """Command lines of the processes whose environment carries ``MESHRUN_RUN_ID=run_id`` (what
    the agent's stop looks for)."""
    found, mark = [], f"MESHRUN_RUN_ID={run_id}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return found


def _children() -> set[int]:
    """This process's living child processes (wandb starts wandb-core as one)."""
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[1] == me and fields[0] != "Z":
            out.add(int(pid))
    return out
