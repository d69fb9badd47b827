"""What `fab train --resume ID` runs (a first-run review, its first finding).

The hint after every fetch and every elastic failure is a bare `fab train --resume ID`. The resume
took only the record's inventory and hosts, never its workload: pasted after a `--script train.py
-- --epochs 100` run, it ran the built-in trainer's digits job in that run's directory and reported
"succeeded"; after `fab train -- epochs=100` it resumed with 20 epochs and ended at once. It now
runs what the run ran (deploy/run/workload.py), its --timeout and elastic bounds too. Pure, with
the real record files and the controller's own resume step on a real runs directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from meshrun.deploy.commands import train as train_cmd
from meshrun.deploy.edges.records import RunRecord
from meshrun.deploy.edges.trainercheck import check_trainer_args
from meshrun.deploy.errors import InputError
from meshrun.deploy.project import Project
from meshrun.deploy.render.console import Renderer
from meshrun.deploy.run.plan import Workload
from meshrun.deploy.run.workload import described, refuse_trainer_flags, resumed_nnodes, resumed_work

RUN = "20260101-000000-beef"
SCRIPT = Workload("train.py", None, ("--epochs", "100"))
TRAINER = Workload(None, "exp.yaml", ("comm.hook=hier", "epochs=100"))


def test_a_bare_resume_runs_what_the_run_ran_and_says_so() -> None:
    work = resumed_work(RUN, SCRIPT, 900, Workload(), None, False)
    assert (work.workload, work.pg_timeout_s) == (SCRIPT, 900)
    assert work.note == f"resume: run {RUN} runs as it ran: --script train.py -- --epochs 100"
    trainer = resumed_work(RUN, TRAINER, 1800, Workload(), 60, False)
    assert (trainer.workload, trainer.pg_timeout_s) == (TRAINER, 60)
    assert trainer.note == f"resume: run {RUN} runs as it ran: --config exp.yaml -- comm.hook=hier epochs=100"
    plain = resumed_work(RUN, Workload(), 1800, Workload(), None, False)
    assert (plain.workload, plain.note) == (Workload(), None)


def test_a_resume_adds_overrides_after_the_runs_and_a_new_comm_chooses_the_hook_anew() -> None:
    extended = resumed_work(RUN, TRAINER, 1800, Workload(args=("epochs=200",)), None, False).workload
    assert extended.args == ("comm.hook=hier", "epochs=100", "epochs=200")  # the last of a key wins
    assert resumed_work(RUN, TRAINER, 1800, Workload(config="exp.yaml"), None, True).workload.args == ("epochs=100",)
    # A script's arguments cannot be merged: new ones replace the run's, with or without --script repeated.
    assert resumed_work(RUN, SCRIPT, 1800, Workload(args=("--epochs", "200")), None, False).workload == \
        Workload("train.py", None, ("--epochs", "200"))
    assert resumed_work(RUN, SCRIPT, 1800, Workload("train.py"), None, False).workload == SCRIPT


@pytest.mark.parametrize("recorded,given,message", [
    (SCRIPT, Workload("other.py"), f"--resume {RUN}: that run ran --script train.py, not --script other.py; resume "
                                   "it with the same --script (or none)"),
    (SCRIPT, Workload(config="exp.yaml"), f"--resume {RUN}: that run ran --script train.py; --config is the built-in "
                                          "trainer's: your script's own flags go after --"),
    (TRAINER, Workload("train.py"), f"--resume {RUN}: that run ran --config exp.yaml -- comm.hook=hier epochs=100, "
                                    "not --script train.py; its checkpoints are the trainer's: start a new run for "
                                    "the script"),
    (TRAINER, Workload(config="big.yaml"), f"--resume {RUN}: that run ran --config exp.yaml, not --config big.yaml; "
                                           "leave --config out (key=value overrides after -- still apply)"),
    (Workload(), Workload(config="big.yaml"), f"--resume {RUN}: that run ran the trainer's default config, not "
                                              "--config big.yaml; leave --config out (key=value overrides after -- "
                                              "still apply)"),
])
def test_a_resume_naming_another_workload_is_one_line(recorded: Workload, given: Workload, message: str) -> None:
    with pytest.raises(InputError) as info:
        resumed_work(RUN, recorded, 1800, given, None, False)
    assert str(info.value) == message


def test_the_trainers_flags_with_a_script_are_refused_not_dropped() -> None:
    """`--script train.py --config exp7.yaml` (the `--` forgotten) ran the script without its config."""
    with pytest.raises(InputError) as info:
        refuse_trainer_flags(Workload("train.py", "configs/exp 7.yaml"), False)
    assert str(info.value) == ("--config is the built-in trainer's; your script's own flags go after --: fab train "
                               "--script train.py -- --config 'configs/exp 7.yaml'")
    with pytest.raises(InputError) as info:
        refuse_trainer_flags(Workload("train.py"), True)
    assert str(info.value) == ("--timeout is the built-in trainer's process-group timeout; a --script sets its own "
                               "(init_process_group(timeout=...))")
    refuse_trainer_flags(Workload(config="exp.yaml"), True)
    refuse_trainer_flags(Workload("train.py", None, ("--config", "x")), False)
    assert described(Workload("my dir/t.py", None, ("a b",))) == "--script 'my dir/t.py' -- 'a b'"


def test_elastic_bounds_come_back_with_min_at_most_the_hosts() -> None:
    assert resumed_nnodes((2, 3), 3) == "2:3"
    assert resumed_nnodes((2, 3), 1) == "1:3"
    assert resumed_nnodes(None, 3) is None


def test_the_controllers_resume_step_takes_the_records_workload(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The reviewer's case, on a real runs directory: a script run that ended, resumed bare."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: 192.0.2.1}\n  h2: {address: 192.0.2.2}\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1", "h2"), time.time() - 3600, False, "192.0.2.1:29400",
              elastic=(2, 2), workload={"script": "train.py", "config": None, "args": ["--epochs", "100"]},
              pg_timeout_s=900, controller_pid=None).save(project.runs)
    (project.run_home(RUN) / "summary.json").write_text("{}")
    request = train_cmd._with_resumed_defaults(train_cmd.TrainRequest(None, None, Workload(), resume=RUN), project,
                                               Renderer())
    assert (request.workload, request.pg_timeout_s, request.hosts, request.nnodes) == (SCRIPT, 900, "h1,h2", "2:2")
    out = capsys.readouterr().out
    assert f"resume: run {RUN} runs as it ran: --script train.py -- --epochs 100" in out
    assert "resume: elastic as the run was: --nnodes 2:2" in out
    fresh = train_cmd._with_resumed_defaults(train_cmd.TrainRequest(None, None, Workload()), project, Renderer())
    assert fresh.pg_timeout_s == train_cmd.DEFAULT_PG_TIMEOUT_S


def test_a_script_named_after_the_dash_dash_gets_the_flag_it_wanted(tmp_path: Path) -> None:
    (tmp_path / "my_train.py").write_text("print('hi')\n")
    with pytest.raises(InputError) as info:
        check_trainer_args(Workload(args=("my_train.py", "--epochs", "3")), 60, tmp_path)
    assert str(info.value).endswith("; to run your own script: fab train --script my_train.py -- --epochs 3")


def test_a_resume_asks_only_the_hosts_it_launches_on_whether_the_run_still_runs(tmp_path: Path,
                                                                                monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A security review: every host of the record was asked, so one compromised member answering
    `running` for ever blocked `fab train --resume ID --hosts <the others>`, the documented way to
    resume without it. A host left out cannot join the new attempt (its rendezvous id is fresh).
    `host_states` (an SSH fan-out) is replaced by one that answers as that member would."""
    from meshrun.deploy.run.hoststate import HostState

    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: 192.0.2.1}\n  h2: {address: 192.0.2.2}\n"
                                         "  h3: {address: 192.0.2.3}\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1", "h2", "h3"), time.time() - 3600, True, "192.0.2.1:29400",
              controller_pid=None).save(project.runs)
    asked: list[tuple[str, ...]] = []

    def states(record: RunRecord, root: Path) -> list[HostState]:
        asked.append(record.hosts)
        return [HostState(RUN, name, "running" if name == "h3" else "stopped") for name in record.hosts]

    monkeypatch.setattr(train_cmd, "host_states", states)
    request = train_cmd.TrainRequest(None, "h1,h2", Workload(), resume=RUN)
    assert train_cmd._with_resumed_defaults(request, project, Renderer()).hosts == "h1,h2"
    with pytest.raises(InputError) as info:
        train_cmd._with_resumed_defaults(train_cmd.TrainRequest(None, None, Workload(), resume=RUN), project,
                                         Renderer())
    assert "the run is still running (its agents still run on h3)" in str(info.value)
    assert asked == [("h1", "h2"), ("h1", "h2", "h3")]


def test_a_resume_repeating_the_runs_script_as_typed_then_is_the_same_script(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A review: `--script ./train.py` (or the absolute path) was compared as typed with the record's
    root-relative `train.py`, and refused as another script."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  h1: {address: 192.0.2.1}\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    project = Project(tmp_path, tmp_path / "runs")
    RunRecord(RUN, str(tmp_path / "hosts.yaml"), ("h1",), time.time() - 3600, False, "192.0.2.1:29400",
              workload={"script": "train.py", "config": None, "args": ["--epochs", "100"]},
              controller_pid=None).save(project.runs)
    (project.run_home(RUN) / "summary.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for typed in ("./train.py", str(tmp_path / "train.py")):
        request = train_cmd.TrainRequest(None, None, Workload(typed), resume=RUN)
        assert train_cmd._with_resumed_defaults(request, project, Renderer()).workload == SCRIPT
