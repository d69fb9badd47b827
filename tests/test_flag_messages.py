"""A flag given twice, a value given to a switch, a misspelt flag, and the trainer's key typed as a flag are
one line naming the flag and the fix, exit status 2 (bad-input finding 9). invoke's own words named the
value instead: `--hosts gpu1 --hosts gpu1` was "No idea what 'gpu1' is", `--detach=yes` "No idea what
'yes' is", `--host nosuch` and `train --epochs 3` had no hint at all.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.flagwords import (FlagSpec, Stray, as_overrides, find_stray, stray_line, trainer_keys,
                                     unknown_flag_line)
from meshrun.train.config import TrainConfig, _all_keys
from tests.clirun import git_project, run_meshrun

CONFIG_SOURCE = Path(__file__).resolve().parents[1] / "train" / "config.py"
FLAGS = {"--hosts": FlagSpec("--hosts", True), "-h": FlagSpec("--hosts", True),
         "--lines": FlagSpec("--lines", True), "-l": FlagSpec("--lines", True),
         "--notify": FlagSpec("--notify", True, repeatable=True), "--detach": FlagSpec("--detach", False),
         "-d": FlagSpec("--detach", False), "--skip-checks": FlagSpec("--skip-checks", False)}


def test_the_first_word_invoke_cannot_place_and_the_flag_before_it() -> None:
    assert find_stray(["--hosts", "a", "--hosts", "b"], FLAGS) == Stray("b", 3, "--hosts", earlier="a")
    assert find_stray(["-h", "a", "--detach", "--hosts=b,c"], FLAGS) == Stray("b,c", 3, "--hosts", True, "a")
    assert find_stray(["--detach=yes"], FLAGS) == Stray("yes", 0, "--detach", glued=True)
    assert find_stray(["-d", "run1"], FLAGS) == Stray("run1", 1, "-d")
    assert find_stray(["--hosts", "a", "b"], FLAGS) == Stray("b", 2)  # after a value, not a flag
    assert find_stray(["--host", "a"], FLAGS) == Stray("--host", 0)
    assert find_stray(["--notify", "u1", "--notify", "u2", "-d"], FLAGS) is None  # a list flag takes each
    assert find_stray(["--hosts", "--detach"], FLAGS) is None  # invoke: --hosts needs a value (its own line)
    assert find_stray(["up", "--hosts", "a", "--hosts", "b"], FLAGS, positional=1) == Stray("b", 4, "--hosts",
                                                                                       earlier="a")  # firewall's
    assert find_stray(["up", "down"], FLAGS, positional=1) == Stray("down", 1)


def test_the_lines_name_the_flag_and_the_fix() -> None:
    assert stray_line(Stray("b", 3, "--hosts", earlier="a"), FLAGS, "meshrun train") == (
        "--hosts is given twice ('a', then 'b'); give it once, several hosts comma-separated: --hosts a,b")
    assert stray_line(Stray("gpu1", 3, "-h", earlier="gpu1"), FLAGS, "meshrun train") == (
        "--hosts is given twice ('gpu1', then 'gpu1'); give it once: --hosts gpu1")
    assert stray_line(Stray("6", 3, "--lines", earlier="5"), FLAGS, "meshrun logs") == (
        "--lines is given twice ('5', then '6'); give it once")
    assert stray_line(Stray("yes", 0, "--detach", glued=True), FLAGS, "meshrun train") == (
        "--detach is a switch and takes no value ('yes'); give --detach alone")
    assert stray_line(Stray("run1", 1, "-d"), FLAGS, "meshrun stop") == (
        "--detach takes no value, so 'run1' after it is no flag's; give --detach alone, and 'run1' after the flag "
        "it is for (`meshrun stop --help` lists them)")
    assert stray_line(Stray("b", 2), FLAGS, "meshrun train") is None  # invoke's own words then
    assert unknown_flag_line("--host", FLAGS, "check-network") == (
        "'--host' is not a flag of check-network; did you mean --hosts?")
    assert unknown_flag_line("--bogus", FLAGS, "status") is None


def test_the_trainer_keys_are_read_from_its_source_as_the_trainer_knows_them() -> None:
    keys = trainer_keys(CONFIG_SOURCE.read_text())
    assert set(keys) == set(_all_keys(TrainConfig, ""))  # the controller imports no trainer; the test may
    assert (keys["epochs"], keys["optim.lr"], keys["sync_bn"]) == ("int", "float", "bool")


def test_the_trainer_keys_typed_as_flags_become_overrides() -> None:
    keys = {"epochs": "int", "optim.lr": "float", "sync_bn": "bool", "checkpoint.every_steps": "int",
            "perf.every_steps": "int"}
    words = ["--epochs", "3", "--lr=0.1", "--sync-bn", "--skip-checks", "--optim.lr", "1"]
    assert as_overrides(words, keys, FLAGS) == (("epochs=3", "optim.lr=0.1", "sync_bn=true"), 4)
    assert as_overrides(["--every-steps", "5"], keys, FLAGS) == ((), 0)  # two keys end so: neither is guessed
    assert as_overrides(["--epochs"], keys, FLAGS) == (("epochs=VALUE",), 1)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return git_project(tmp_path)


CASES = [
    (("check-network", "--hosts", "gpu1", "--hosts", "gpu1"),
     "--hosts is given twice ('gpu1', then 'gpu1'); give it once: --hosts gpu1"),
    (("train", "--hosts", "gpu1", "--hosts", "gpu2"),
     "--hosts is given twice ('gpu1', then 'gpu2'); give it once, several hosts comma-separated: --hosts gpu1,gpu2"),
    (("logs", "--lines", "5", "--lines", "6"), "--lines is given twice ('5', then '6'); give it once"),
    (("firewall", "up", "-h", "a", "--hosts", "b"),
     "--hosts is given twice ('a', then 'b'); give it once, several hosts comma-separated: --hosts a,b"),
    (("train", "--detach=yes"), "--detach is a switch and takes no value ('yes'); give --detach alone"),
    (("check-network", "--host", "nosuch"), "'--host' is not a flag of check-network; did you mean --hosts?"),
    (("train", "--epochs", "3"),
     "'--epochs' is not a meshrun flag but a key of the trainer's config; set it after --: meshrun train -- epochs=3"),
    (("train", "--hosts", "gpu1", "--epochs=3", "--lr", "0.1", "-k", "--", "seed=1"),
     "'--epochs' is not a meshrun flag but a key of the trainer's config; set it after --: meshrun train --hosts "
     "gpu1 -k -- epochs=3 optim.lr=0.1 seed=1"),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a)[:40] for a, _ in CASES])
def test_the_real_command_says_which_flag_and_what_to_do(project: Path, args: tuple[str, ...], expected: str) -> None:
    done = run_meshrun(project, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {expected}\n")


# Runs meshrun's real parsing and prints what `train` would get, instead of training.
SHOW_REQUEST = """import json, sys
import meshrun.deploy.commands.train as train
train.main = lambda r, project: print(json.dumps({"hosts": r.hosts, "skip_checks": r.skip_checks,
                                                  "args": r.workload.args})) or 0
from meshrun.deploy.program import program
program.run(["meshrun", *sys.argv[1:]])
"""


def test_the_fixed_command_runs_as_meant(project: Path) -> None:
    done = run_meshrun(project, "train", "--hosts", "gpu1", "--epochs", "3", "--lr", "0.1", "-k", "--", "seed=1")
    argv = shlex.split(done.stderr.split(": meshrun ", 1)[1])
    pasted = subprocess.run([sys.executable, "-c", SHOW_REQUEST, *argv], cwd=project, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert pasted.returncode == 0, pasted.stderr
    assert json.loads(pasted.stdout) == {"hosts": "gpu1", "skip_checks": True, "args": ["epochs=3", "optim.lr=0.1",
                                                                                         "seed=1"]}


@pytest.mark.parametrize("args", [("firewall", "--help"), ("firewall", "up", "--help"), ("train", "--help")])
def test_a_task_with_a_positional_argument_answers_help_too(project: Path, args: tuple[str, ...]) -> None:
    """invoke gave `--help` to firewall's positional `action`, and the task ran with the action '--help'."""
    done = run_meshrun(project, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: meshrun [--core-opts] {args[0]} [--options]"), done.stdout[:200]
