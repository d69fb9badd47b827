"""A --script run's own `result.json` survives the next agent start (user-script finding 8).

On a remote host a script's `$MESHRUN_RUN_DIR` is `runs/<id>` in the workdir, where the built-in
trainer's rank 0 writes its `result.json`. Every agent start (`--resume`, `join`, a host coming back)
removed that file so that the last attempt's result could not pass for this one's, and so deleted a
script's own `$MESHRUN_RUN_DIR/result.json`. Now the agent removes it only when its command (torchrun's
argv, as the launch planner builds it) runs the built-in trainer. Pure but for a tmp workdir."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshrun.deploy.host.agent import Supervisor
from meshrun.deploy.host.agentargs import parse, ranks_run_dir, runs_trainer
from meshrun.deploy.inventory.model import Rendezvous
from meshrun.deploy.inventory.selection import Selection
from meshrun.deploy.run.plan import LaunchOptions, Workload, plan_launch
from meshrun.layout import AGENT_MODULE, EXIT_RECORD, RESULT, host_dir, run_dir
from tests.fakesession import host

RUN = "20261206-094153-f0c3"
SCRIPT = Workload(script="main.py", args=("--epochs", "200"))
# A script whose own arguments name the trainer's module: still a script run.
SCRIPT_NAMING_TRAINER = Workload(script="main.py", args=("-m", "meshrun.train", "-m"))
TRAINER = Workload(config="configs/tiny.yaml", args=("train.epochs=2",))


def planned_agent_argv(workload: Workload, detach: bool = False) -> list[str]:
    """The agent's argv after `python -m meshrun.deploy.host.agent`, as the controller plans it for a
    remote host (its workdir is not the project: no --run-dir)."""
    remote = dataclasses.replace(host(), name="gpu2", address="10.0.0.2")
    options = LaunchOptions(RUN, workload, detach=detach)
    agent = plan_launch(Selection((remote,), Rendezvous(None)), options, {}, "/py").hosts[0].agent
    assert agent[1:3] == ("-m", AGENT_MODULE) and "--run-dir" not in agent
    return list(agent[3:])


def test_the_agent_tells_the_trainer_from_a_script_by_its_planned_command() -> None:
    verdicts = [runs_trainer(parse(planned_agent_argv(work, detach)).command)
                for work in (SCRIPT, SCRIPT_NAMING_TRAINER, TRAINER) for detach in (False, True)]
    assert verdicts == [False, False, False, False, True, True]
    assert runs_trainer(["true"]) is False  # a command that is neither: nothing of the run's is removed


def claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload: Workload) -> tuple[list[str], bool]:
    """A workdir after a first attempt (the script's files in $MESHRUN_RUN_DIR, the agent's exit record),
    then the next agent start's claim: what is left in runs/<id>, and whether exit.json is."""
    monkeypatch.chdir(tmp_path)  # the agent runs in the workdir
    args = parse(planned_agent_argv(workload))
    args.quiet = True  # no controller pipe: nothing reads this test's stdout
    out = Path(ranks_run_dir(args))
    assert out == tmp_path / run_dir(RUN)  # a remote host: the script's folder is runs/<id> itself
    out.mkdir(parents=True)
    (out / RESULT).write_text('{"final_top1": 76.1}')
    (out / "best_model.pt").write_bytes(b"x")
    Path(host_dir(RUN, "gpu2")).mkdir(parents=True)
    (Path(host_dir(RUN, "gpu2")) / EXIT_RECORD).write_text('{"rc": 0}')
    supervisor = Supervisor(args)
    assert supervisor.claim() is None
    supervisor.log.file.close()
    return sorted(p.name for p in out.iterdir()), (Path(host_dir(RUN, "gpu2")) / EXIT_RECORD).exists()


def test_a_script_runs_result_json_survives_the_next_agent_start(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert claimed(tmp_path, monkeypatch, SCRIPT) == (["best_model.pt", "hosts", RESULT], False)


def test_a_trainer_runs_last_result_is_still_forgotten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert claimed(tmp_path, monkeypatch, TRAINER) == (["best_model.pt", "hosts"], False)
