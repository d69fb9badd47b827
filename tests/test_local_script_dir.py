"""A --script run on a host whose workdir is the project itself (the default local inventory,
`workdir: .`): the first-run review, finding F2.

There the ranks' `$MESHRUN_RUN_DIR` was the controller's own `runs/<id>/`, so a script's
`summary.json` was overwritten by the controller's, made a detached run that still ran look ended
(`fab stop` without --run then stopped another run and exited 0), and its `metrics.jsonl` was read by
`fab report`. Now such a host's ranks get `runs/<id>/hosts/<host>/output` (a folder of the script's
own, beside the agent's files), the fetch says so, and a summary.json counts as a run's end only when
it is the controller's. Remote hosts keep `runs/<id>` in their workdir (fetch brings it home).
Pure but for a tmp dir and one real agent running a one-line command (no torchrun, no host)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrun.deploy.edges.fetch import FetchReport
from meshrun.deploy.edges.records import RunRecord, has_own_summary, live_records, resolve_live_run
from meshrun.deploy.host.agentargs import detached_argv, parse, run_env
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import LaunchOptions, Workload, plan_launch
from meshrun.layout import AGENT_MODULE, ENV_RUN_DIR, SUMMARY
from tests.fakesession import host

RUN, OLDER = "20261206-094153-f0c3", "20261206-093909-5984"
OUTPUT = f"runs/{RUN}/hosts/local/output"


def local_inventory(project: Path, workdir: str) -> Path:
    path = project / "hosts.yaml"
    path.write_text(f"hosts:\n  local: {{address: local, nproc: 1, workdir: '{workdir}'}}\n"
                    "  gpu1: {address: 10.0.0.1, nproc: 1}\n")
    return path


@pytest.mark.parametrize("workdir, expected", [(".", True), ("./", True), ("{project}", True), ("work", False),
                                               ("{project}/work", False)])
def test_the_inventory_knows_a_local_host_whose_workdir_is_the_project(tmp_path: Path, workdir: str,
                                                                       expected: bool) -> None:
    inventory = load_inventory(local_inventory(tmp_path, workdir.format(project=tmp_path)), tmp_path)
    assert (inventory.host("local").workdir_is_project, inventory.host("gpu1").workdir_is_project) == (expected, False)
    # Without the project (a caller that has none) nothing is assumed.
    assert load_inventory(local_inventory(tmp_path, "."), None).host("local").workdir_is_project is False


def agent_of(workdir_is_project: bool, script: str | None, address: str = "local") -> tuple[str, ...]:
    one = dataclasses.replace(host(), name="local", address=address, workdir=".", python=None,
                              workdir_is_project=workdir_is_project)
    options = LaunchOptions(RUN, Workload(script=script), detach=True)
    return plan_launch(Selection((one,), Rendezvous(None)), options, {}, "/py").hosts[0].agent


def test_only_a_script_run_on_the_project_itself_gets_a_folder_of_its_own() -> None:
    agent = agent_of(True, "train.py")
    assert agent[:12] == ("/py", "-m", AGENT_MODULE, "run", "--run-id", RUN, "--host", "local",
                          "--heartbeat-timeout", "0", "--detach", "--run-dir")
    assert agent[12] == OUTPUT
    assert "--run-dir" not in agent_of(False, "train.py")  # a local workdir elsewhere: its runs/<id> comes home
    assert "--run-dir" not in agent_of(True, None)  # the built-in trainer finds its run dir by MESHRUN_RUN_ID


def test_the_agent_and_its_detached_copy_give_the_ranks_that_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the agent runs in the workdir
    args = parse(["run", "--run-id", RUN, "--host", "local", "--run-dir", OUTPUT, "--", "python", "x.py"])
    args.secret_env = {}
    assert run_env(args, "mark")[0][ENV_RUN_DIR] == f"{os.path.realpath(tmp_path)}/{OUTPUT}"
    copy = detached_argv(args, "/py")
    assert copy[copy.index("--run-dir") + 1] == OUTPUT
    plain = parse(["run", "--run-id", RUN, "--host", "gpu1", "--", "python", "x.py"])
    plain.secret_env = {}
    assert run_env(plain, "mark")[0][ENV_RUN_DIR] == f"{os.path.realpath(tmp_path)}/runs/{RUN}"  # remote: as before
    assert "--run-dir" not in detached_argv(plain, "/py")


SCRIPT = ("import os, pathlib; d = pathlib.Path(os.environ['MESHRUN_RUN_DIR']); "
          "(d / 'summary.json').write_text('{\"best_loss\": 0.33}'); (d / 'metrics.jsonl').write_text('{}\\n')")


def test_a_scripts_summary_and_metrics_never_land_in_the_controllers_record(tmp_path: Path) -> None:
    """A real agent, as the plan starts it on the local default host, runs a 'script' that writes
    meshrun's own file names into $MESHRUN_RUN_DIR: they land in its folder (made for it), not
    beside launch.json, and a live detached run stays live and is the one `fab stop` takes."""
    runs = tmp_path / "runs"
    RunRecord(OLDER, "/inv.yaml", ("local",), time.time() - 3600, True, "standalone").save(runs)
    (runs / OLDER / SUMMARY).write_text(json.dumps({"run_id": OLDER, "status": "stopped"}))  # the controller's
    RunRecord(RUN, "/inv.yaml", ("local",), time.time() - 60, True, "standalone").save(runs)
    agent = agent_of(True, "train.py")  # detached: no heartbeat; run here in the foreground, so it is waited for
    argv = [sys.executable, *(a for a in agent[1:agent.index("--") + 1] if a != "--detach"), sys.executable, "-c",
            SCRIPT]
    done = subprocess.run(argv, cwd=tmp_path, input="{}\n", capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads((tmp_path / OUTPUT / SUMMARY).read_text()) == {"best_loss": 0.33}
    assert not (runs / RUN / SUMMARY).exists() and not (runs / RUN / "metrics.jsonl").exists()
    assert [r.run_id for r in live_records(runs)] == [RUN]
    assert resolve_live_run(runs, None, "fab stop").run_id == RUN


@pytest.mark.parametrize("text, ended", [
    (json.dumps({"run_id": RUN, "status": "succeeded"}), True),
    (json.dumps({"run_id": RUN, "status": "failed", "hosts": ["local"]}), True),
    (json.dumps({"run_id": RUN, "status": "stopped"}), True),
    ('{"best_loss": 0.33}', False),  # a script's
    (json.dumps({"run_id": OLDER, "status": "succeeded"}), False),  # another run's, copied here
    (json.dumps({"run_id": RUN, "status": "ok"}), False),
    (json.dumps({"run_id": RUN, "status": ["succeeded"]}), False),  # unhashable: no TypeError
    ("[1, 2]", False), ("not json", False), ("", False),
])
def test_only_the_controllers_summary_ends_a_run(tmp_path: Path, text: str, ended: bool) -> None:
    (tmp_path / SUMMARY).write_text(text)
    assert has_own_summary(tmp_path, RUN) is ended


def test_a_summary_that_is_no_regular_file_or_too_large_is_no_end(tmp_path: Path) -> None:
    assert has_own_summary(tmp_path, RUN) is False  # none at all
    os.mkfifo(tmp_path / SUMMARY)  # would hang an unbounded read
    assert has_own_summary(tmp_path, RUN) is False
    os.unlink(tmp_path / SUMMARY)
    big = json.dumps({"run_id": RUN, "status": "succeeded", "pad": "x" * (1 << 20)})
    (tmp_path / SUMMARY).write_text(big)
    assert has_own_summary(tmp_path, RUN) is False


def test_the_fetch_names_the_scripts_own_folder_on_the_project_itself(capsys) -> None:  # type: ignore[no-untyped-def]
    home = f"/p/runs/{RUN}"
    Renderer().fetch_reports(RUN, home, [FetchReport("local", Path(home))], script="train.py")
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert (f"what train.py wrote under $MESHRUN_RUN_DIR on local: {home}/hosts/local/output/; its logs: "
            f"{home}/hosts/local/ (docs/scripts.md)") in out
    assert "hosts/<host>/" not in out
    Renderer().fetch_reports(RUN, home, [FetchReport("gpu1", Path(home) / "hosts/gpu1")], script="train.py")
    out = " ".join(capsys.readouterr().out.split())
    assert f"what train.py wrote under $MESHRUN_RUN_DIR, and the logs: {home}/hosts/<host>/ (as each host" in out
    assert "output/" not in out
