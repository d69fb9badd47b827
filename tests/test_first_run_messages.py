"""A researcher's first day (findings first-run F7, F8, F9; slow-links 6): the mistakes a first user
makes get the fix in one line, a --script run's report shows what the run recorded, and a data
file cut mid-transfer resumes instead of starting again from byte 0."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.commands.report import NO_METRICS, script_outcome, script_run_lines
from meshrun.deploy.edges.datasync import DataSpec, build_manifest, rsync_data_argv
from meshrun.deploy.edges.sync import ssh_argv
from meshrun.deploy.errors import InputError
from meshrun.deploy.fabexec import ReadAs, Typed, misplaced_argument_hint
from meshrun.deploy.inventory.model import Host, Network
from meshrun.deploy.project import Project, relative_to_project
from tests.clirun import git_project, run_meshrun

RUN = "20261206-093525-9a0c"


def host(address: str = "10.0.0.2", workdir: str = "~/meshrun") -> Host:
    return Host(name="gpu2", address=address, ssh_address=None, user="ubuntu", port=2222, identity=None,
                python="python3", workdir=workdir, network=Network.LAN, gpus=(), nproc=1, batch_size=None, env=())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return git_project(tmp_path)


# --- slow-links 6: `fab sync --data` resumes a file cut mid-transfer ---------------------------------

def test_data_sync_argv_keeps_a_cut_file_to_resume_from(tmp_path: Path) -> None:
    kh = tmp_path / "kh"
    kh.write_text("")
    spec = DataSpec(tmp_path / "data", "data/c10")
    assert rsync_data_argv(host(), spec, tmp_path, kh, checksum=False) == [
        "rsync", "--protect-args", "--timeout=60", "--archive", "--copy-unsafe-links", "--mkpath", "--itemize-changes",
        "--partial-dir=.meshrun-partial", "--exclude", ".meshrun-hash-cache.json", "-e",
        shlex.join(ssh_argv(host(), kh)), f"{tmp_path / 'data'}/", "10.0.0.2:meshrun/data/c10/"]
    local = host("local", str(tmp_path / "wd"))
    assert rsync_data_argv(local, spec, tmp_path, None, checksum=True, files=["a"]) == [
        "rsync", "--protect-args", "--timeout=60", "--archive", "--copy-unsafe-links", "--mkpath", "--itemize-changes",
        "--partial-dir=.meshrun-partial", "--exclude", ".meshrun-hash-cache.json", "--checksum", "--files-from=-",
        "--from0", f"{tmp_path / 'data'}/", f"{tmp_path / 'wd/data/c10'}/"]


# Stands in for ssh: runs the remote rsync here (rsync gives it `[options] HOST rsync --server ...`).
LOOPBACK_SSH = """#!/bin/sh
while [ "$#" -gt 0 ] && [ "$1" != rsync ]; do shift; done
exec "$@"
"""


def test_the_real_rsync_resumes_from_what_a_cut_transfer_left(tmp_path: Path) -> None:
    """What a transfer cut at the deadline leaves (the file's first half, in DEST's .meshrun-partial/)
    is the next run's basis: only the other half crosses the link, and the partial folder is gone."""
    src, workdir = tmp_path / "data", tmp_path / "wd"
    (src / "shards").mkdir(parents=True)
    big = os.urandom(4 << 20)
    (src / "shards/big.bin").write_bytes(big)
    partial = workdir / "ds/shards/.meshrun-partial/big.bin"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(big[:2 << 20])
    fake = tmp_path / "ssh"
    fake.write_text(LOOPBACK_SSH)
    fake.chmod(stat.S_IRWXU)
    argv = rsync_data_argv(host(workdir=str(workdir)), DataSpec(src, "ds"), tmp_path, None, checksum=False)
    argv[argv.index("-e") + 1] = str(fake)
    done = subprocess.run([*argv[:-2], "--stats", *argv[-2:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    literal = next(int(line.split(":")[1].split()[0].replace(",", "")) for line in done.stdout.splitlines()
                   if line.startswith("Literal data:"))
    assert literal <= (2 << 20) + (64 << 10)  # the second half (and a block's slack), not 4 MiB from byte 0
    assert (workdir / "ds/shards/big.bin").read_bytes() == big
    assert not partial.parent.exists()


def test_a_source_holding_the_partial_folder_is_refused_by_name(tmp_path: Path) -> None:
    """rsync never sends a folder of that name, so its files would fail verification at every sync."""
    (tmp_path / "src/a/.meshrun-partial").mkdir(parents=True)
    (tmp_path / "src/a/.meshrun-partial/x.bin").write_bytes(b"x")
    with pytest.raises(InputError) as err:
        build_manifest(tmp_path / "src")
    assert str(err.value) == (f"--data: {tmp_path / 'src/a/.meshrun-partial'}: meshrun keeps partly sent files "
                              "under that name at DEST; delete it if a sync left it, or rename it")


# --- F8: a script's arguments given without `--` ----------------------------------------------------

def test_a_scripts_flag_before_the_double_dash_gets_the_fixed_command() -> None:
    hint = misplaced_argument_hint
    assert hint("--epochs", "train", "t.py", ["--epochs", "3"], "fab") == (
        "'--epochs' is not a meshrun flag; put the script's own arguments after --: "
        "fab train --script t.py -- --epochs 3")
    assert hint("--x", "train", "my t.py", ["--x", "a b"], "meshrun") == (
        "'--x' is not a meshrun flag; put the script's own arguments after --: "
        "meshrun train --script 'my t.py' -- --x 'a b'")
    assert hint("epochs=2", "train", "", ["epochs=2"], "meshrun") == (
        "'epochs=2' is not a meshrun flag; the trainer's key=value overrides go after --: meshrun train -- epochs=2")
    typed = Typed(("train", "--inventory", "inventory/my lab.yaml", "--hosts", "gpu1,gpu2", "--detach", "--script",
                   "train.py"), ("--checkpoint-every", "2"), ("--lr", "0.1"))
    assert hint("--epochs", "train", "train.py", ["--epochs", "3"], "meshrun", typed) == (
        "'--epochs' is not a meshrun flag; put the script's own arguments after --: meshrun train --inventory "
        "'inventory/my lab.yaml' --hosts gpu1,gpu2 --detach --script train.py --checkpoint-every 2 -- --epochs 3 "
        "--lr 0.1")  # every other flag kept, in its order; only the script's words moved, before those after --
    assert hint("--bogus", "train", "", ["--bogus"], "meshrun") is None  # a misspelt flag keeps invoke's words
    assert hint("--epochs", "status", "", ["--epochs"], "meshrun") is None


def test_the_real_command_says_where_the_scripts_arguments_go(project: Path) -> None:
    done = run_meshrun(project, "train", "--script", "t.py", "--epochs", "3", "--hosts", "gpu1")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: '--epochs' is not a meshrun flag; put the script's own arguments after --: "
                           "meshrun train --script t.py --hosts gpu1 -- --epochs 3\n")
    # Pasted, the fix runs where the typed command would have: same inventory, hosts, --detach (stop51 #7).
    done = run_meshrun(project, "train", "--inventory", "inventory/lab.yaml", "--hosts", "gpu1,gpu2", "--detach",
                       "--script", "train.py", "--epochs", "3")
    assert done.stderr == ("error: '--epochs' is not a meshrun flag; put the script's own arguments after --: "
                           "meshrun train --inventory inventory/lab.yaml --hosts gpu1,gpu2 --detach --script "
                           "train.py -- --epochs 3\n")
    done = run_meshrun(project, "train", "--hosts", "gpu1", "epochs=2", "--", "lr=0.1")
    assert done.stderr == ("error: 'epochs=2' is not a meshrun flag; the trainer's key=value overrides go after --: "
                           "meshrun train --hosts gpu1 -- epochs=2 lr=0.1\n")
    done = run_meshrun(project, "train", "--script", "t.py", "--epochs=3")
    assert done.stderr.endswith("meshrun train --script t.py -- --epochs=3\n")
    assert run_meshrun(project, "status", "--bogus").stderr == "error: No idea what '--bogus' is; see --help\n"


# --- user-script 1: a script's short flags (seed 004's -a -b -p -e) clash with meshrun's ------------

# Runs meshrun's real parsing and prints the request `train` would get, instead of training.
SHOW_REQUEST = """import json, sys
import meshrun.deploy.commands.train as train
train.main = lambda r, project: print(json.dumps({"detach": r.detach, "firewall": r.firewall, "hosts": r.hosts,
    "skip_checks": r.skip_checks, "no_sync": r.no_sync, "script": r.workload.script, "args": r.workload.args})) or 0
from meshrun.deploy.program import program
program.run(["meshrun", *sys.argv[1:]])
"""


def pasted(cwd: Path, hint: str) -> dict:
    """What the command the hint prints asks of `train`, pasted as printed."""
    argv = shlex.split(hint.split(": meshrun ", 1)[1])
    done = subprocess.run([sys.executable, "-c", SHOW_REQUEST, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_line_names_the_short_flags_meshrun_read_and_which_it_keeps() -> None:
    read = (ReadAs("-b", "--debug"), ReadAs("-p", "--project"))
    typed = Typed(("train", "--script", "main.py"), (), ("-a", "r"), read)
    assert misplaced_argument_hint("128", "train", "main.py", ["-b", "128", "-p", "20"], "meshrun", typed) == (
        "'128' is not a meshrun flag; meshrun read -b as --debug and -p as --project; put the script's own "
        "arguments after --: meshrun train --script main.py -- -b 128 -p 20 -a r")
    read = (ReadAs("-h", "--hosts", kept=True), ReadAs("-k", "--skip-checks", kept=True), ReadAs("-d", "--detach"))
    typed = Typed(("train", "--script", "main.py", "-h", "gpu1", "-k"), (), (), read)
    assert misplaced_argument_hint("x", "train", "main.py", ["x", "-d"], "meshrun", typed) == (
        "'x' is not a meshrun flag; meshrun read -h as --hosts (kept), -k as --skip-checks (kept) and -d as "
        "--detach; "
        "put the script's own arguments after -- (a kept flag too, if it is the script's): meshrun train --script "
        "main.py -h gpu1 -k -- x -d")


def test_a_scripts_short_flags_go_after_the_double_dash_and_are_named(project: Path) -> None:
    """Seed 004 typed without `--`: the old line left -b and -p before `--` as meshrun's --debug and
    --project, and its pasted command failed again (or ran with --detach: `./data -d`)."""
    done = run_meshrun(project, "train", "--script", "main.py", "-a", "r", "-b", "128", "-p", "20", "./data")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: '-a' is not a meshrun flag; meshrun read -b as --debug and -p as --project; put "
                           "the script's own arguments after --: meshrun train --script main.py -- -a r -b 128 -p 20 "
                           "./data\n")
    assert pasted(project, done.stderr)["args"] == ["-a", "r", "-b", "128", "-p", "20", "./data"]
    # The old line's own "fix", typed: -b was taken as --debug, so 128 was the unknown word; -b goes too.
    done = run_meshrun(project, "train", "--script", "main.py", "-b", "128", "-p", "20", "./data", "--", "-a", "r")
    assert (done.returncode, done.stderr) == (2, "error: '128' is not a meshrun flag; meshrun read -b as --debug and "
                                              "-p as --project; put the script's own arguments after --: meshrun "
                                              "train --script main.py -- -b 128 -p 20 ./data -a r\n")
    assert pasted(project, done.stderr)["args"] == ["-b", "128", "-p", "20", "./data", "-a", "r"]
    done = run_meshrun(project, "train", "--script", "main.py", "./data", "-d", "--hosts", "gpu1")
    assert (done.returncode, done.stderr) == (2, "error: './data' is not a meshrun flag; meshrun read -d as --detach; "
                                              "put the script's own arguments after --: meshrun train --script "
                                              "main.py --hosts gpu1 -- ./data -d\n")  # a long flag stays meshrun's
    request = pasted(project, done.stderr)
    assert (request["detach"], request["hosts"], request["args"]) == (False, "gpu1", ["./data", "-d"])


def test_short_flags_before_the_scripts_words_stay_meshruns_and_are_named(project: Path) -> None:
    done = run_meshrun(project, "train", "-s", "main.py", "-h", "gpu1", "-k", "--epochs", "3")
    assert (done.returncode, done.stderr) == (2, "error: '--epochs' is not a meshrun flag; meshrun read -h as --hosts "
                                              "(kept) and -k as --skip-checks (kept); put the script's own arguments "
                                              "after -- (a kept flag too, if it is the script's): meshrun train -s "
                                              "main.py -h gpu1 -k -- --epochs 3\n")
    request = pasted(project, done.stderr)
    assert (request["hosts"], request["skip_checks"], request["args"]) == ("gpu1", True, ["--epochs", "3"])
    # The trainer's key=value overrides are no script's: meshrun's short flags after them stay its own.
    done = run_meshrun(project, "train", "--hosts", "gpu1", "epochs=2", "-d")
    assert done.stderr == ("error: 'epochs=2' is not a meshrun flag; the trainer's key=value overrides go after --: "
                           "meshrun train --hosts gpu1 -d -- epochs=2\n")


# --- F9: `--script "-m pkg.train"` -------------------------------------------------------------------

LAUNCHER = 'import runpy; runpy.run_module("pkg.train", run_name="__main__", alter_sys=True)'


def test_a_module_for_script_names_the_file_and_the_launcher(project: Path) -> None:
    proj = Project(project, project / "runs")
    with pytest.raises(InputError) as err:
        relative_to_project("-m other.mod", proj, "--script", cwd=project)
    assert str(err.value) == ("--script -m other.mod: --script takes a file, not a module; pass a launcher "
                              'run_mod.py holding: import runpy; runpy.run_module("other.mod", run_name="__main__", '
                              "alter_sys=True) (docs/scripts.md)")
    (project / "pkg").mkdir()
    (project / "pkg/train.py").write_text("")
    for given in ("-m pkg.train", "pkg.train"):
        with pytest.raises(InputError) as err:
            relative_to_project(given, proj, "--script", cwd=project)
        assert str(err.value) == (f"--script {given}: --script takes a file, not a module; pass --script "
                                  "pkg/train.py if it imports none of its package, else a launcher run_train.py "
                                  f"holding: {LAUNCHER} (docs/scripts.md)")
    for missing in ("nosuch.py", "cifar10_toy.yaml", "other.mod"):  # a missing file, not a module: the plain answer
        with pytest.raises(InputError) as err:
            relative_to_project(missing, proj, "--script", cwd=project)
        assert str(err.value) == f"--script {missing}: no such file in the project {project}"


MODULE = """import pickle, sys
from .models import double

class Box:
    pass

if __name__ == "__main__":
    pickle.dumps(Box())
    print(double(21), sys.argv[1:])
"""


def test_the_launcher_the_message_names_runs_a_module_with_relative_imports(tmp_path: Path) -> None:
    """What the message and docs/scripts.md promise, under meshrun's runner: the file itself fails on
    its relative import; the launcher runs it, arguments and pickling of its classes included."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/models.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "pkg/train.py").write_text(MODULE)
    (tmp_path / "run_train.py").write_text(LAUNCHER.replace("; ", "\n") + "\n")
    runner = [sys.executable, "-m", "meshrun.deploy.host.runscript"]
    direct = subprocess.run([*runner, "pkg/train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert direct.returncode == 1 and "attempted relative import" in direct.stderr
    launched = subprocess.run([*runner, "run_train.py", "--epochs", "3"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    assert (launched.returncode, launched.stdout) == (0, "42 ['--epochs', '3']\n"), launched.stderr


# --- F7: `fab report` of a --script run ---------------------------------------------------------------

PROVENANCE = {"project": {"commit": "1eaa145", "dirty": False}, "meshrun": {"version": "0.1.0", "build": "a4cf"},
              "hosts": {}, "links": None, "trainer_config": None, "checkpoints": None}
SUMMARY = {"run_id": RUN, "status": "failed", "hosts": ["gpu1", "gpu2"], "world_size": 2, "restarts": 1,
           "duration_s": 14.87, "started": 1000.0, "reason": "gpu2 exited 1", "failed_host": "gpu2",
           "host_results": {"gpu1": {"rc": 0}, "gpu2": {"rc": None}},
           "timeline": [{"time": 1000.0, "event": "started", "host": "gpu1", "world_size": 2},
                        {"time": 1012.5, "event": "lost", "host": "gpu2", "world_size": 1, "detail": None}],
           "metrics": {}, "epochs_completed": 0, "provenance": PROVENANCE}


def test_a_script_runs_outcome_reads_as_lines() -> None:
    outcome = script_outcome(SUMMARY)
    assert script_run_lines(RUN, "train.py", outcome, ("gpu1", "gpu2")) == [
        f"run {RUN}: ran --script train.py; failed, world size 2, restarts 1, 14.9 s, failed on gpu2, "
        "reason: gpu2 exited 1",
        "hosts: gpu1 (exit 0), gpu2 (lost)",
        "timeline +0.0 s: started gpu1 (world size 2)",
        "timeline +12.5 s: lost gpu2 (world size 1)"]
    edited = {**SUMMARY, "status": "great", "world_size": "2", "timeline": [{"time": "x"}], "host_results": []}
    assert script_run_lines(RUN, "train.py", script_outcome(edited), ("gpu1",)) == [
        f"run {RUN}: ran --script train.py; status unknown, restarts 1, 14.9 s, failed on gpu2, reason: gpu2 exited 1",
        "hosts: gpu1"]
    assert script_run_lines(RUN, "train.py", script_outcome(None), ("gpu1", "gpu2")) == [
        f"run {RUN}: ran --script train.py; no summary.json (detached, or not ended yet): fab status --run {RUN}",
        "hosts: gpu1, gpu2"]


def record_script_run(project: Path, summary: dict | None) -> Path:
    home = project / "runs" / RUN
    home.mkdir(parents=True)
    launch = {"run_id": RUN, "inventory": str(project / "hosts.yaml"), "hosts": ["gpu1", "gpu2"], "started": 1000.0,
              "detached": False, "rdzv_endpoint": "standalone", "rdzv_id": RUN, "elastic": None,
              "workload": {"script": "train.py", "config": None, "args": []}, "controller_pid": None}
    (home / "launch.json").write_text(json.dumps(launch))
    if summary is not None:
        (home / "summary.json").write_text(json.dumps(summary))
    return home


def test_report_of_a_script_run_shows_what_it_recorded_and_exits_0(project: Path) -> None:
    home = record_script_run(project, SUMMARY)
    done = run_meshrun(project, "report")
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"run {RUN}: ran --script train.py; failed, world size 2, restarts 1, 14.9 s, failed on "
                         "gpu2, reason: gpu2 exited 1", "hosts: gpu1 (exit 0), gpu2 (lost)"]
    assert "project: commit 1eaa145, clean" in lines and "meshrun: 0.1.0 (build a4cf)" in lines
    assert lines[-1] == NO_METRICS
    assert not (home / "report.png").exists()
    shown = json.loads(run_meshrun(project, "report", "--json").stdout)
    assert (shown["status"], shown["exits"], shown["ranks"], shown["provenance"]) == (
        "failed", {"gpu1": 0, "gpu2": None}, [], PROVENANCE)


def test_report_of_a_remote_script_run_that_wrote_its_own_metrics_jsonl_is_the_script_view(project: Path) -> None:
    """$MESHRUN_RUN_DIR is runs/<id> on a remote host, and `fab fetch-checkpoints` brings a script's own
    metrics.jsonl home to hosts/<host>/: the run's record (it ran a script) decides, not that file."""
    home = record_script_run(project, SUMMARY)
    fetched = home / "hosts" / "gpu1"
    fetched.mkdir(parents=True)
    (fetched / "metrics.jsonl").write_text('{"step": 1, "loss": 0.9}\n{"step": 2, "loss": 0.8}\n')
    done = run_meshrun(project, "report", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    shown = json.loads(done.stdout)
    assert (shown["note"], shown["status"], shown["skipped"], shown["png"]) == (NO_METRICS, "failed", [], None)
    assert not (home / "report.png").exists()


def test_report_still_refuses_a_script_run_that_recorded_nothing(project: Path) -> None:
    record_script_run(project, None)
    done = run_meshrun(project, "report")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: run {RUN}: no metrics under {project / 'runs' / RUN}: it ran --script train.py, "
                           "and runs of a user script record no metrics (only the built-in trainer writes "
                           "metrics.jsonl)\n")
