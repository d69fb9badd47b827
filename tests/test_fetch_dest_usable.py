"""`fab fetch-checkpoints --dest D` leaves D a runs folder (findings day2 #8): the run's records come
with its files, so `--runs-dir D` finds the run for `fab report` and for `fab train --resume`, whose
push reads D's checkpoints then, and the resume hint the fetch prints names `--runs-dir D`. Before,
D held `checkpoints/` and `hosts/` only: report answered `no D/<id>/launch.json`, and the hint said a
resume would push back checkpoints it never reads. Real `meshrun` on a local host (rsync, no sshd)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from meshrun.deploy.edges.checkpointpush import copy_records
from meshrun.deploy.edges.records import RunRecord, load_record
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.manifest import manifest_text, parse_manifest
from meshrun.deploy.run.recordcopy import RECORDS, RecordsHeld, records_to_copy
from tests.clirun import git_project, run_meshrun

RUN = "20261206-180903-209b"
STEP = "ckpt-step000000300.pt"
EPOCH = {"kind": "epoch", "epoch": 1, "train_loss": 0.5, "test_loss": 0.4, "test_acc": 0.9, "test_acc5": 1.0,
         "world_size": 1, "global_step": 300, "time": 1.0}
RANK0 = {"kind": "step", "rank": 0, "host": "h1", "samples_per_s": 1000.0, "step_s": 0.02, "data_s": 0.001,
         "fwd_bwd_s": 0.01, "optim_s": 0.001, "peak_mem_bytes": 2**20}
SUMMARY = b'{"run_id": "' + RUN.encode() + b'", "status": "stopped", "reason": "interrupted (Ctrl-C)"}\n'
PROVENANCE = b'{"meshrun": {"version": "0.1.0"}}\n'


def _local_run(root: Path) -> Path:
    """A run of h1 (`address: local`, workdir w1) as the controller and the trainer leave it: the
    record, an attached run's summary and a provenance in `runs/<id>/`, and on the host a checkpoint,
    its manifest and rank 0's metrics. Returns the controller's run folder."""
    (root / "inventory").mkdir()
    (root / "inventory/hosts.yaml").write_text("hosts:\n  h1:\n    address: local\n    nproc: 1\n    workdir: w1\n")
    runs = root / "runs"
    RunRecord(RUN, str(root / "inventory/hosts.yaml"), ("h1",), 1000.0, False, "h1:29500").save(runs)
    (runs / RUN / "summary.json").write_bytes(SUMMARY)
    (runs / RUN / "provenance.json").write_bytes(PROVENANCE)
    host = root / "w1/runs" / RUN
    (host / "checkpoints").mkdir(parents=True)
    (host / "checkpoints" / STEP).write_bytes(b"weights at 300")
    digest = hashlib.sha256(b"weights at 300").hexdigest()
    (host / "checkpoints/MANIFEST.sha256").write_text(manifest_text({STEP: digest}))
    (host / "metrics.jsonl").write_text(json.dumps(EPOCH) + "\n")
    (host / "metrics.rank0.jsonl").write_text(json.dumps(RANK0) + "\n")
    return runs / RUN


def test_a_fetch_into_dest_leaves_a_runs_folder_report_and_resume_read(tmp_path: Path) -> None:
    root = git_project(tmp_path)
    home = _local_run(root)
    dest = tmp_path / "dest"
    fetched = run_meshrun(root, "fetch-checkpoints", "--run", RUN, "--dest", str(dest), env={"COLUMNS": "400"})
    assert fetched.returncode == 0, fetched.stderr
    out = " ".join(fetched.stdout.split())
    assert (f"resume this run: meshrun train --runs-dir {dest} --resume {RUN} (same hosts; the newest checkpoint is "
            "pushed back if the hosts lost it)") in out
    for name in ("launch.json", "summary.json", "provenance.json"):  # the controller's own, byte for byte
        assert (dest / RUN / name).read_bytes() == (home / name).read_bytes()
    assert not (dest / RUN / "commplan.json").exists()  # none here: none there
    assert load_record(dest, RUN) == load_record(root / "runs", RUN)
    # What `fab train --resume --runs-dir D` pushes back: the checkpoints its project's run home lists.
    pushed_from = Project(root, dest).run_home(RUN) / "checkpoints"
    assert sorted(parse_manifest((pushed_from / "MANIFEST.sha256").read_bytes()).digests()) == [STEP]
    report = run_meshrun(root, "report", "--runs-dir", str(dest), "--run", RUN, "--json")
    assert report.returncode == 0, report.stderr
    shown = json.loads(report.stdout)
    assert (shown["run_id"], shown["final_test_acc"], [r["host"] for r in shown["ranks"]]) == (RUN, 0.9, ["h1"])


def test_a_fetch_into_the_runs_folder_itself_names_no_runs_dir(tmp_path: Path) -> None:
    root = git_project(tmp_path)
    _local_run(root)
    fetched = run_meshrun(root, "fetch-checkpoints", "--run", RUN, env={"COLUMNS": "400"})
    assert fetched.returncode == 0, fetched.stderr
    out = " ".join(fetched.stdout.split())
    assert f"resume this run: meshrun train --resume {RUN} (same hosts;" in out and "--runs-dir" not in out


def _held(started: float | None, **written: int) -> RecordsHeld:
    return RecordsHeld(started, {name.replace("_", "."): at for name, at in written.items()})


def test_which_records_a_fetch_copies() -> None:
    ours = _held(2.0, launch_json=10, summary_json=20, provenance_json=5)
    assert RECORDS == ("launch.json", "summary.json", "provenance.json", "commplan.json")
    # Nothing there yet: every record here, launch.json first.
    assert records_to_copy(ours, _held(None)) == (False, ("launch.json", "summary.json", "provenance.json"))
    # An earlier attempt there: its records become *.prev.json, then every record of this one.
    assert records_to_copy(ours, _held(1.0, launch_json=99, summary_json=99)) == (
        True, ("launch.json", "summary.json", "provenance.json"))
    # The same attempt: what was written here since the copy there (the summary at the run's end).
    assert records_to_copy(ours, _held(2.0, launch_json=15, provenance_json=15)) == (False, ("summary.json",))
    # A later attempt there (resumed with --runs-dir D): kept whole.
    assert records_to_copy(ours, _held(3.0, launch_json=1)) == (False, ())
    assert records_to_copy(_held(None), _held(None)) == (False, ())


def _save(runs: Path, started: float, summary: bytes | None) -> None:
    RunRecord(RUN, "/inv.yaml", ("h1",), started, False, "h1:29500").save(runs)
    if summary is not None:
        (runs / RUN / "summary.json").write_bytes(summary)


def test_copy_records_never_puts_an_older_attempt_over_a_later_one(tmp_path: Path, capsys) -> None:
    runs, dest = tmp_path / "runs", tmp_path / "dest"
    _save(runs, 1000.0, SUMMARY)
    _save(dest, 2000.0, None)  # resumed from D since: its attempt is running, no summary yet
    later = (dest / RUN / "launch.json").read_bytes()
    assert copy_records(load_record(runs, RUN), runs, dest, Renderer()) == ()
    assert (dest / RUN / "launch.json").read_bytes() == later and not (dest / RUN / "summary.json").exists()
    assert "holds a later attempt of run" in " ".join(capsys.readouterr().out.split())


def test_copy_records_of_a_later_attempt_retires_the_earlier_ones_there(tmp_path: Path) -> None:
    runs, dest = tmp_path / "runs", tmp_path / "dest"
    _save(dest, 1000.0, b'{"status": "failed"}\n')  # fetched there before a resume from runs/
    _save(runs, 2000.0, None)  # the resumed attempt, still running: no summary
    assert copy_records(load_record(runs, RUN), runs, dest, Renderer()) == ("launch.json",)
    assert load_record(dest, RUN).started == 2000.0
    assert not (dest / RUN / "summary.json").exists()  # else the run would read as ended, failed
    assert (dest / RUN / "summary.prev.json").read_bytes() == b'{"status": "failed"}\n'


def test_copy_records_brings_a_summary_written_since_the_last_copy(tmp_path: Path) -> None:
    runs, dest = tmp_path / "runs", tmp_path / "dest"
    _save(runs, 1000.0, None)
    assert copy_records(load_record(runs, RUN), runs, dest, Renderer()) == ("launch.json",)
    (runs / RUN / "summary.json").write_bytes(SUMMARY)
    assert copy_records(load_record(runs, RUN), runs, dest, Renderer()) == ("summary.json",)
    assert (dest / RUN / "summary.json").read_bytes() == SUMMARY
